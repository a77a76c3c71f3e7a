"""Isolation and security over HTTP, against ``radixgate serve --tiny`` with
several tenant keys and an admin key.

Paired tests assert both halves: the same tenant hits its cache, another tenant gets 0
cached tokens. A client-chosen cache_salt cannot join another tenant's namespace, and
namespace derivation is prefix-free. Stats, metrics and the dashboard shown to a tenant
never mention another tenant's name, prefixes, hit counts or text. Admin routes refuse
tenant keys (403) and missing/unknown keys (401).
"""
from __future__ import annotations

import uuid

import pytest

from radixgate.gateway.auth import namespace_for
from tests.support import client as c
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

SPEC = ServerSpec()
ACME, BETA = tenant_key("acme"), tenant_key("beta")


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


async def fresh(http, server, *tenants: str) -> None:
    """Empty the tenants' unsalted namespaces and ``public`` (tenants opted into public
    prefixes match it too, and other suites on this server, e.g. the OpenAPI fuzzer,
    publish there): their next cache read is exactly 0 unless something of their own is
    cached."""
    for tenant in tenants:
        await c.flush_tenant(http, server.base_url, ADMIN_KEY, tenant)
    status, answer = await c.post_json(http, server.base_url + "/v1/cache/flush", ADMIN_KEY,
                                       {"public": True})
    assert status == 200, answer


def secret_prompt(tag: str) -> str:
    """~120 tokens of text unique to this test run, marked with ``tag``."""
    nonce = uuid.uuid4().hex[:12]
    return f"{tag}-{nonce} " + " ".join(f"{tag}{i} {nonce[i % 12]}" for i in range(50))


async def messages_usage(http, server, key, system: str | list, user: str = "hi") -> dict:
    status, body = await c.post_json(http, server.base_url + c.ANTHROPIC_PATH, key,
                                     c.anthropic_body(user, system=system, max_tokens=2))
    assert status == 200, body
    return body["usage"]


async def chat_cached(http, server, key, system: str, **extra) -> int:
    status, body = await c.post_json(http, server.base_url + c.CHAT_PATH, key,
                                     c.chat_body("hi", system=system, max_tokens=2, **extra))
    assert status == 200, body
    return body["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)


async def test_same_tenant_hits_and_other_tenant_gets_no_cached_tokens_messages(http, server):
    prompt = secret_prompt("iso")
    await fresh(http, server, "acme", "beta")
    first = await messages_usage(http, server, ACME, prompt)
    again = await messages_usage(http, server, ACME, prompt)
    other = await messages_usage(http, server, BETA, prompt)
    assert first["cache_read_input_tokens"] == 0
    assert again["cache_read_input_tokens"] >= 100
    assert other["cache_read_input_tokens"] == 0
    assert other["input_tokens"] + other["cache_creation_input_tokens"] == \
        again["input_tokens"] + again["cache_read_input_tokens"] + again["cache_creation_input_tokens"]


async def test_same_tenant_hits_and_other_tenant_gets_no_cached_tokens_chat(http, server):
    prompt = secret_prompt("chatiso")
    await fresh(http, server, "acme", "beta")
    assert await chat_cached(http, server, ACME, prompt) == 0
    assert await chat_cached(http, server, ACME, prompt) >= 100
    assert await chat_cached(http, server, BETA, prompt) == 0


async def test_client_cache_salt_equal_to_another_tenants_still_misses(http, server):
    prompt, salt = secret_prompt("salt"), "shared-salt-" + uuid.uuid4().hex[:6]
    await fresh(http, server, "acme")
    assert await chat_cached(http, server, ACME, prompt, cache_salt=salt) == 0
    assert await chat_cached(http, server, ACME, prompt, cache_salt=salt) >= 100
    assert await chat_cached(http, server, BETA, prompt, cache_salt=salt) == 0
    assert await chat_cached(http, server, ACME, prompt) == 0          # unsalted: other namespace
    assert await chat_cached(http, server, ACME, prompt, cache_salt=salt + "x") == 0


async def test_prompt_cache_key_never_joins_caches(http, server):
    prompt, key = secret_prompt("pck"), "routing-" + uuid.uuid4().hex[:6]
    await fresh(http, server, "acme", "beta")
    assert await chat_cached(http, server, ACME, prompt, prompt_cache_key=key) == 0
    assert await chat_cached(http, server, BETA, prompt, prompt_cache_key=key) == 0
    assert await chat_cached(http, server, ACME, prompt, prompt_cache_key="other") >= 100


def test_namespace_derivation_is_prefix_free():
    assert namespace_for("org_1", "2345") != namespace_for("org_12345", "")
    assert namespace_for("org_1", "2345") != namespace_for("org_12345", None)
    assert namespace_for("org_12345", "") == namespace_for("org_12345", None)
    assert namespace_for("a", "bc") != namespace_for("ab", "c")
    assert namespace_for("acme", "x") != namespace_for("beta", "x")


async def test_tenant_plus_salt_cannot_reach_the_concatenated_tenants_cache(http, server):
    prompt = secret_prompt("pf")
    org_1, org_12345 = tenant_key("org_1"), tenant_key("org_12345")
    await fresh(http, server, "org_12345")
    assert await chat_cached(http, server, org_1, prompt, cache_salt="2345") == 0
    assert await chat_cached(http, server, org_1, prompt, cache_salt="2345") >= 100
    assert await chat_cached(http, server, org_12345, prompt) == 0


async def test_public_prefix_is_shared_but_a_tenants_continuation_never_lands_in_public(
        http, server):
    system = secret_prompt("pub")
    await fresh(http, server, "acme", "beta")
    status, published = await c.post_json(http, server.base_url + "/v1/cache/prefixes",
                                          ADMIN_KEY, {"system": system, "ttl": "5m"})
    assert status == 200 and published["namespace"] == "public", published
    public_tokens = published["tokens"]
    user = "continue " + uuid.uuid4().hex + " " + " ".join(f"c{i}" for i in range(30))
    acme_first = await messages_usage(http, server, ACME, system, user)
    acme_again = await messages_usage(http, server, ACME, system, user)
    beta = await messages_usage(http, server, BETA, system, user)
    assert acme_first["cache_read_input_tokens"] >= public_tokens       # public prefix reused
    assert beta["cache_read_input_tokens"] >= public_tokens
    assert acme_again["cache_read_input_tokens"] > public_tokens + 20   # its own continuation
    assert beta["cache_read_input_tokens"] < public_tokens + 16         # not acme's
    status, _ = await c.post_json(http, server.base_url + "/v1/cache/flush", ADMIN_KEY,
                                  {"public": True})
    assert status == 200
