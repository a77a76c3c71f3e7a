"""Pins are shared out per tenant, and billed as what the cache did.

The server-wide pin ceiling (``pin_share`` of the KV budget) is divided evenly among the
configured tenants and the admin: one tenant pinning all it can leaves every other tenant
its own share. A breakpoint whose pin is skipped (share used up) is uncached input, not
cache creation. The "does not fit" error names the request's numbers and the configured
capacity only, never what is pinned server-wide.
"""
from __future__ import annotations

import re
import uuid

import pytest

from radixgate.runtime.engine.api import Breakpoint
from radixgate.runtime.engine.engine_config import TenantQuota
from tests.support import client as c
from tests.support.engine_compare import assert_clean, greedy
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

# 131 blocks of 16 (2096 tokens), ceiling 1048 tokens, 3 tenants + admin: 262 tokens each.
# The context is larger than the cache, so a long prompt reaches the KV-size check.
SPEC = ServerSpec(kv_cache_gb=0.001, max_model_len=4096, tenants=("pin_a", "pin_b", "pin_c"),
                  kv_dtype="float32",
                  max_pinned_tokens=100_000)
A, B, C = (tenant_key(t) for t in SPEC.tenants)
PARTIES = len(SPEC.tenants) + 1


# ------------------------------------------------------------------ engine level

def test_one_tenant_pinning_all_it_can_leaves_the_other_its_share(make_engine):
    # ceiling 0.5 * 64 * 16 = 512 tokens, two tenants: 256 each
    engine = make_engine(num_blocks=64, tenant_quotas={"a": TenantQuota(), "b": TenantQuota()})
    firsts = []
    for i in range(4):                       # a asks for 4 x 200 = 800 tokens of pins
        prompt = [3000 + 300 * i + j for j in range(210)]
        firsts.append(engine.generate(greedy(prompt, max_tokens=2, tenant="a", namespace="na",
                                             breakpoints=(Breakpoint(200, 300.0),))))
    assert engine.request_snapshot().result().tenants["a"].pinned_tokens == 200
    assert [f.usage.cache_creation_tokens for f in firsts] == [200, 0, 0, 0]
    assert [f.usage.uncached_tokens for f in firsts] == [10, 210, 210, 210]   # billed as input
    b = engine.generate(greedy([9000 + j for j in range(210)], max_tokens=2, tenant="b",
                               namespace="nb", breakpoints=(Breakpoint(200, 300.0),)))
    assert b.usage.cache_creation_tokens == 200
    assert engine.request_snapshot().result().tenants["b"].pinned_tokens == 200
    assert_clean(engine)


def test_extending_a_pinned_prefix_counts_only_the_added_tokens(make_engine):
    engine = make_engine(num_blocks=64, tenant_quotas={"a": TenantQuota(max_pinned_tokens=150)})
    head = [4000 + j for j in range(100)]
    engine.generate(greedy(head + [5000 + j for j in range(40)], max_tokens=2, tenant="a",
                           namespace="na", breakpoints=(Breakpoint(100, 300.0),)))
    # 100 + 130 > 150 if the pinned head counted again; it adds 30 tokens only
    longer = engine.generate(greedy(head + [6000 + j for j in range(40)], max_tokens=2,
                                    tenant="a", namespace="na",
                                    breakpoints=(Breakpoint(100, 300.0), Breakpoint(130, 300.0))))
    assert longer.usage.cache_read_tokens == 100 and longer.usage.cache_creation_tokens == 30
    assert engine.request_snapshot().result().tenants["a"].pinned_tokens == 130
    assert_clean(engine)


# ------------------------------------------------------------------ over HTTP

@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


def system_text(tag: str, n_words: int = 55) -> list[dict]:
    text = f"{tag} {uuid.uuid4().hex} " + " ".join(f"w{i}" for i in range(n_words))
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]


async def ask(http, server, key, system, user="hi", max_tokens=2) -> dict:
    body = c.anthropic_body(user, system=system, max_tokens=max_tokens)
    status, answer = await c.post_json(http, server.base_url + c.ANTHROPIC_PATH, key, body)
    assert status == 200, answer
    return answer["usage"]


async def pinned_tokens(http, server, key, tenant) -> int:
    status, stats = await c.get_json(http, server.base_url + "/v1/cache/stats", key)
    assert status == 200, stats
    return stats["tenants"][tenant]["pinned_tokens"]


async def too_long_message(http, server, key) -> str:
    body = c.anthropic_body(" ".join(f"x{i}" for i in range(800)), max_tokens=8)
    status, answer = await c.post_json(http, server.base_url + c.ANTHROPIC_PATH, key, body)
    assert status == 400, answer
    return answer["error"]["message"]


async def share_of(http, server) -> int:
    _, stats = await c.get_json(http, server.base_url + "/v1/cache/stats", ADMIN_KEY)
    return stats["blocks"]["total"] * stats["block_size"] // 2 // PARTIES


async def test_tenant_within_its_share_pins_after_another_filled_the_ceiling(http, server):
    share = await share_of(http, server)
    assert re.search(rf"pin_a={share}\b.*pin_b={share}\b", server.log_tail(20_000))
    before = await too_long_message(http, server, B)
    a_usages = [await ask(http, server, A, system_text(f"a{i}")) for i in range(6)]
    a_pinned = await pinned_tokens(http, server, A, "pin_a")
    assert 0 < a_pinned <= share
    b_usage = await ask(http, server, B, system_text("b"))
    assert b_usage["cache_creation_input_tokens"] > 100
    assert 100 < await pinned_tokens(http, server, B, "pin_b") <= share
    # a's pins beyond its share were skipped and billed as input, not as cache creation
    skipped = [u for u in a_usages if u["cache_creation_input_tokens"] == 0]
    assert len(skipped) >= 4
    assert all(u["input_tokens"] > 100 for u in skipped)
    # the too-long error reads the same whatever is pinned: no server-wide pinned count
    after = await too_long_message(http, server, B)
    assert after == before and "pins" not in after
    assert "131 blocks" in after


async def test_skipped_pin_is_billed_as_input_tokens(http, server):
    share = await share_of(http, server)
    first = await ask(http, server, C, system_text("c0"))
    assert 100 < first["cache_creation_input_tokens"] <= share
    second = await ask(http, server, C, system_text("c1"))       # over c's share: skipped
    assert second["cache_creation_input_tokens"] == 0
    assert second["cache_creation"]["ephemeral_5m_input_tokens"] == 0
    assert second["input_tokens"] >= first["cache_creation_input_tokens"]
    assert await pinned_tokens(http, server, C, "pin_c") == pytest.approx(
        first["cache_creation_input_tokens"], abs=8)
