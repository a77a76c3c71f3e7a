"""What one tenant can see and do to another, over HTTP against
``radixgate serve --tiny``:

- stats, metrics and the dashboard shown to a tenant never carry another tenant's name,
  prefixes, hit counts or text (the admin view does: asserted too, so the check can fail);
- one tenant flooding the server evicts neither another tenant's pinned prefix (within its
  quota) nor starves its requests;
- only the admin key reaches flush, prefixes and integrity (tenant key 403, none/unknown 401).
"""
from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support import client as c
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

SPEC = ServerSpec()
ACME, BETA, GAMMA = tenant_key("acme"), tenant_key("beta"), tenant_key("gamma")


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


def pinned_system(text: str) -> list[dict]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]


async def post_messages(http, server, key, system, user="hi", max_tokens=2) -> dict:
    status, body = await c.post_json(http, server.base_url + c.ANTHROPIC_PATH, key,
                                     c.anthropic_body(user, system=system, max_tokens=max_tokens))
    assert status == 200, body
    return body


async def get_text(http, url: str, key: str | None) -> tuple[int, str]:
    async with http.get(url, headers=c.headers(key)) as r:
        return r.status, await r.text()


async def test_tenant_views_never_show_another_tenants_name_prefixes_or_text(http, server):
    nonce = "zq" + uuid.uuid4().hex[:10]
    secret = f"{nonce} confidential acme prompt " + " ".join(f"w{i}" for i in range(40))
    for _ in range(2):                                   # a pinned prefix with a hit
        await post_messages(http, server, ACME, pinned_system(secret))
    await post_messages(http, server, BETA, "beta's own prompt " + uuid.uuid4().hex)

    status, admin_stats = await get_text(http, server.base_url + "/v1/cache/stats", ADMIN_KEY)
    assert status == 200 and "acme" in admin_stats and nonce in admin_stats   # admin preview
    status, beta_stats = await get_text(http, server.base_url + "/v1/cache/stats", BETA)
    assert status == 200
    assert "acme" not in beta_stats and nonce not in beta_stats
    stats = c._json_or_none(beta_stats)
    assert set(stats["tenants"]) == {"beta"}
    assert all(p["tenant"] == "beta" and "preview" not in p for p in stats["top_prefixes"])

    status, admin_metrics = await get_text(http, server.base_url + "/metrics", ADMIN_KEY)
    assert status == 200 and 'tenant="acme"' in admin_metrics
    status, beta_metrics = await get_text(http, server.base_url + "/metrics", BETA)
    assert status in (200, 403)
    assert "acme" not in beta_metrics and nonce not in beta_metrics

    status, page = await get_text(http, server.base_url + "/dashboard", BETA)
    assert "acme" not in page and nonce not in page


async def test_anonymous_caller_sees_no_tenant_data(http, server):
    await post_messages(http, server, ACME, "anon check " + uuid.uuid4().hex)
    for path in ("/v1/cache/stats", "/metrics"):
        status, text = await get_text(http, server.base_url + path, None)
        assert status == 401 or 'tenant="acme"' not in text and '"acme"' not in text, path


ADMIN_ROUTES = [("POST", "/v1/cache/flush", {}),
                ("GET", "/v1/cache/prefixes", None),
                ("POST", "/v1/cache/prefixes", {"text": "x", "ttl_s": 60}),
                ("DELETE", "/v1/cache/prefixes", {"text": "x"}),
                ("GET", c.INTEGRITY_PATH, None)]


@pytest.mark.parametrize("method,path,body", ADMIN_ROUTES)
async def test_admin_routes_refuse_tenant_keys_and_missing_keys(http, server, method, path, body):
    url = server.base_url + path
    for key, expected in ((ACME, 403), (None, 401), ("sk-not-a-key", 401)):
        async with http.request(method, url, headers=c.headers(key), json=body) as r:
            text = await r.text()
            assert r.status == expected, (key, r.status, text)
            assert c.check_error_envelope("openai", r.status, text) is None


@pytest.mark.parametrize("method,path", [("GET", "/v1/cache/prefixes"),
                                         ("GET", c.INTEGRITY_PATH)])
async def test_admin_key_reaches_admin_routes(http, server, method, path):
    async with http.request(method, server.base_url + path, headers=c.headers(ADMIN_KEY)) as r:
        assert r.status == 200, await r.text()


async def flood(http, server, key, n: int, done: list) -> list[int]:
    """n concurrent distinct ~250-token prompts; appends to ``done`` as each finishes."""
    async def one(i):
        body = c.anthropic_body("flood", system=f"flood {i} {uuid.uuid4().hex} " +
                                " ".join(f"f{i}x{j}" for j in range(60)), max_tokens=8)
        status, _ = await c.post_json(http, server.base_url + c.ANTHROPIC_PATH, key, body)
        done.append(status)
        return status
    return await asyncio.gather(*(one(i) for i in range(n)))


async def test_flooding_tenant_neither_evicts_a_pinned_prefix_nor_starves_its_owner(http, server):
    prefix = f"gamma pinned {uuid.uuid4().hex} " + " ".join(f"g{i}" for i in range(30))
    first = await post_messages(http, server, GAMMA, pinned_system(prefix))
    pinned = first["usage"]["cache_creation_input_tokens"]
    assert 0 < pinned <= SPEC.max_pinned_tokens
    _, before = await c.get_json(http, server.base_url + "/v1/cache/stats", ADMIN_KEY)

    done: list[int] = []
    flood_task = asyncio.create_task(flood(http, server, BETA, 64, done))
    for _ in range(600):                                 # until the flood is in the engine
        _, beta = await c.get_json(http, server.base_url + "/v1/cache/stats", BETA)
        if done or beta["requests"]["running"] + beta["requests"]["waiting"] >= 8:
            break
        await asyncio.sleep(0.05)
    during = await post_messages(http, server, GAMMA, pinned_system(prefix), user="during")
    finished_before_gamma = len(done)
    statuses = await flood_task
    assert finished_before_gamma < len(statuses), "gamma waited for the whole flood"
    assert all(s in (200, 429, 529) for s in statuses), statuses

    _, after = await c.get_json(http, server.base_url + "/v1/cache/stats", ADMIN_KEY)
    assert after["evictions"]["lru"] > before["evictions"]["lru"], "the flood never evicted"
    again = await post_messages(http, server, GAMMA, pinned_system(prefix), user="after")
    assert during["usage"]["cache_read_input_tokens"] >= pinned
    assert again["usage"]["cache_read_input_tokens"] >= pinned
