"""Tenant hardening over real HTTP (tiny model, loopback): pre-engine work is bounded per tenant.

- item 2: a 3,001-message conversation costs a handful of template renders (was one per
  message); a prompt that cannot fit the context is refused before it is rendered;
  count_tokens is rate-limited; a tenant's requests being prepared at once are capped, with
  a bounded wait, beyond which it gets 429 while other tenants are served;
- item 4: a tenant over its share of the waiting queue gets 429 (``rate_limit_error``,
  ``retry-after``), and another tenant is still admitted (not 529);
- item 7: ``cache_salt`` on /v1/messages selects a separate cache namespace.
"""
from __future__ import annotations

import asyncio
import json
import re

import pytest

from tests.support import client as c
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

SPEC = ServerSpec(
    kv_cache_gb=0.02, max_model_len=8192, max_queue=16,
    tenants=("attacker", "victim", "limited", "capped"),
    tenant_overrides=(("limited", (("requests_per_minute", 2),)),
                      ("capped", (("max_preparing", 1), ("max_queued", 1))),
                      ("attacker", (("max_running", 1),))))
ATTACKER, VICTIM = tenant_key("attacker"), tenant_key("victim")


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


async def renders_of(http, base: str, tenant: str) -> float:
    async with http.get(base + "/metrics", headers=c.headers(ADMIN_KEY)) as response:
        text = await response.text()
    found = re.search(r'^radixgate_template_renders_total\{tenant="%s"\} (\S+)$' % tenant,
                      text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def post(http, url: str, key: str, body: dict) -> tuple[int, str]:
    async with http.post(url, headers=c.headers(key), json=body) as response:
        return response.status, await response.text()


def many_messages(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
            for i in range(n)]


async def test_three_thousand_messages_cost_a_handful_of_renders(http, server):
    base = server.base_url
    before = await renders_of(http, base, "attacker")
    body = {"model": c.MODEL, "messages": many_messages(801)}
    status, text = await post(http, base + "/v1/messages/count_tokens", ATTACKER, body)
    assert status == 200, text
    assert json.loads(text)["input_tokens"] > 801 * 4
    counted = await renders_of(http, base, "attacker")
    assert 0 < counted - before <= 8               # was 803: one render per message prefix
    for path in ("/v1/messages/count_tokens", c.ANTHROPIC_PATH):   # ~20,000 tokens > 8,192
        body = {"model": c.MODEL, "max_tokens": 8, "messages": many_messages(3001)}
        status, text = await post(http, base + path, ATTACKER, body)
        assert status == 400 and "too long" in text, text
    assert 0 < await renders_of(http, base, "attacker") - counted <= 16


@pytest.mark.parametrize("path", [c.ANTHROPIC_PATH, c.CHAT_PATH, "/v1/messages/count_tokens"])
async def test_a_prompt_that_cannot_fit_is_refused_before_rendering(http, server, path):
    base = server.base_url
    before = await renders_of(http, base, "attacker")
    huge = "word " * 400_000                       # 2 MB: far more than 8,192 tokens
    body = c.chat_body(huge) if path == c.CHAT_PATH else c.anthropic_body(huge)
    status, text = await post(http, base + path, ATTACKER, body)
    assert status == 400, text
    assert c.check_error_envelope(c.api_of(path), status, text) is None
    assert "too long" in text
    assert await renders_of(http, base, "attacker") == before


async def test_count_tokens_is_rate_limited(http, server):
    url = server.base_url + "/v1/messages/count_tokens"
    body = {"model": c.MODEL, "messages": [{"role": "user", "content": "hi"}]}
    statuses = []
    for _ in range(3):
        async with http.post(url, json=body, headers=c.headers(tenant_key("limited"))) as r:
            statuses.append(r.status)
            retry_after = r.headers.get("retry-after")
            text = await r.text()
    assert statuses == [200, 200, 429], statuses
    assert retry_after is not None and "rate_limit_error" in text


async def slow_body_connection(port: int, key: str) -> asyncio.StreamWriter:
    """Sends headers and half a body, then stalls (holds one of the tenant's slots)."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write((f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: {key}\r\n"
                  "content-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"mo").encode())
    await writer.drain()
    return writer


async def test_a_tenant_over_its_preparing_cap_gets_429_and_others_are_served(http, server):
    capped = tenant_key("capped")
    holders = [await slow_body_connection(server.port, capped) for _ in range(2)]
    try:
        await asyncio.sleep(0.5)                    # one holds the slot, one waits for it
        body = c.anthropic_body("hello", max_tokens=2)
        status, text = await post(http, server.base_url + c.ANTHROPIC_PATH, capped, body)
        assert status == 429 and "rate_limit_error" in text, text
        status, text = await post(http, server.base_url + c.ANTHROPIC_PATH, VICTIM, body)
        assert status == 200, text
    finally:
        for writer in holders:
            writer.close()
    await asyncio.sleep(0.3)
    status, text = await post(http, server.base_url + c.ANTHROPIC_PATH, capped,
                                     c.anthropic_body("hello", max_tokens=2))
    assert status == 200, text                      # the slots came back


async def test_a_tenant_over_its_queue_share_gets_429_not_the_others(http, server):
    base = server.base_url

    async def attack() -> tuple[int, dict]:
        async with http.post(base + c.ANTHROPIC_PATH, headers=c.headers(ATTACKER),
                             json=c.anthropic_body("flood the queue", max_tokens=300)) as r:
            return r.status, dict(r.headers)

    attackers = [asyncio.ensure_future(attack()) for _ in range(24)]
    await asyncio.sleep(0.5)                        # 1 running + 8 waiting (16 / 2 tenants)
    victims = await asyncio.gather(*(post(http, base + c.ANTHROPIC_PATH, VICTIM,
                                                 c.anthropic_body(f"victim {i}", max_tokens=4))
                                     for i in range(5)))
    results = await asyncio.gather(*attackers)
    assert [status for status, _ in victims] == [200] * 5, victims
    statuses = [status for status, _ in results]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) >= 10
    assert all("retry-after" in {k.lower() for k in h} for s, h in results if s == 429)


async def test_cache_salt_on_messages_separates_namespaces(http, server):
    url = server.base_url + c.ANTHROPIC_PATH
    system = [{"type": "text", "text": c.words(__import__("random").Random(7), 120),
               "cache_control": {"type": "ephemeral"}}]

    async def cache_read(salt: str) -> int:
        body = c.anthropic_body("question", system=system, max_tokens=1, cache_salt=salt)
        status, text = await post(http, url, VICTIM, body)
        assert status == 200, text
        return json.loads(text)["usage"]["cache_read_input_tokens"]

    await cache_read("salt-a")
    assert await cache_read("salt-b") == 0          # another namespace: nothing to read
    assert await cache_read("salt-a") > 0           # its own namespace: the prefix is there
