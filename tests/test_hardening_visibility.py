"""What a tenant can see and learn, over HTTP against ``radixgate serve --tiny``:

- a tenant's ``top_prefixes`` come from its own namespaces: another tenant's many hot
  prefixes neither push the tenant's own off its list nor show through it;
- ``cache_salt`` namespaces do not pile up: a tenant's live namespaces stay within its
  ``max_namespaces`` however many distinct salts it sends, and a flush leaves (almost) none.
"""
from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support import client as c
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

MAX_NAMESPACES = 8
CONCURRENCY = 8
SPEC = ServerSpec(kv_cache_gb=0.02, tenants=("hv_attacker", "hv_victim", "hv_salter"),
                  tenant_overrides=(("hv_salter", (("max_namespaces", MAX_NAMESPACES),)),))
ATTACKER, VICTIM, SALTER = (tenant_key(t) for t in SPEC.tenants)


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


async def chat(http, server, key, system: str, **extra) -> dict:
    status, body = await c.post_json(http, server.base_url + c.CHAT_PATH, key,
                                     c.chat_body("q", system=system, max_tokens=1, **extra))
    assert status == 200, body
    return body


async def bounded(jobs, limit: int = CONCURRENCY) -> list:
    gate = asyncio.Semaphore(limit)

    async def one(job):
        async with gate:
            return await job
    return await asyncio.gather(*(one(job) for job in jobs))


async def stats(http, server, key) -> dict:
    status, body = await c.get_json(http, server.base_url + "/v1/cache/stats", key)
    assert status == 200, body
    return body


async def test_a_tenants_top_prefixes_are_its_own_whatever_another_tenant_sends(http, server):
    nonce = uuid.uuid4().hex[:8]
    attack = [f"attacker {nonce} prefix {p} " + " ".join(f"a{p}x{j}" for j in range(60))
              for p in range(30)]
    await bounded([chat(http, server, ATTACKER, system) for system in attack for _ in range(6)])
    victim_prompts = [f"victim {nonce} first", f"victim {nonce} second one"]
    lengths = set()
    for system in victim_prompts:
        for _ in range(3):
            lengths.add((await chat(http, server, VICTIM, system))["usage"]["prompt_tokens"])

    admin = await stats(http, server, ADMIN_KEY)
    assert any(p["tenant"] == "hv_attacker" for p in admin["top_prefixes"])   # can fail
    mine = (await stats(http, server, VICTIM))["top_prefixes"]
    assert mine, "the victim's own prefixes were pushed off its list"
    assert all(p["tenant"] == "hv_victim" and "preview" not in p for p in mine)
    assert lengths <= {p["tokens"] for p in mine}            # both its prompts, whole
    assert max(p["tokens"] for p in mine) == max(lengths)    # nothing longer: not the attacker's
    assert all(p["hits"] <= 6 for p in mine)                 # its own 6 requests at most


async def test_distinct_cache_salts_stay_within_the_tenants_namespace_cap(http, server):
    seen: list[int] = []
    done = asyncio.Event()

    async def watch():
        while not done.is_set():
            seen.append((await stats(http, server, ADMIN_KEY))["tree"]["namespaces"])
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    nonce = uuid.uuid4().hex[:8]
    bodies = await bounded([chat(http, server, SALTER, f"salted {nonce}",
                                 cache_salt=f"{nonce}-{i}") for i in range(500)])
    done.set()
    await watcher
    assert len(bodies) == 500
    after = (await stats(http, server, ADMIN_KEY))["tree"]["namespaces"]
    # the salter's capped namespaces, plus at most the ones busy with its requests in
    # flight, plus the other tests' tenants (a few namespaces of their own)
    bound = MAX_NAMESPACES + CONCURRENCY + 4
    assert seen and max(seen) <= bound, (max(seen), bound)
    assert after <= MAX_NAMESPACES + 4, after
    status, flushed = await c.post_json(http, server.base_url + "/v1/cache/flush", ADMIN_KEY, {})
    assert status == 200, flushed
    assert (await stats(http, server, ADMIN_KEY))["tree"]["namespaces"] <= 1
    assert (await stats(http, server, SALTER))["tree"]["namespaces"] == 0   # admin only
