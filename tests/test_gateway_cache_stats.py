"""``build_stats`` (GET /v1/cache/stats) from a hand-made engine snapshot and usage book:
the token split, per-tenant history, what a tenant may see, and empty percentiles."""
from __future__ import annotations

import json
from types import MappingProxyType

import pytest

from radixgate.gateway.cache_stats import build_stats
from radixgate.gateway.usage_book import UsageBook
from radixgate.runtime.engine.api import Usage
from radixgate.runtime.engine.snapshot import BlockCounts, EngineSnapshot, TenantCounts, TreeCounts


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def snapshot(prefill_rate: float = 5432.1) -> EngineSnapshot:
    return EngineSnapshot(
        time=0.0, block_size=16, blocks=BlockCounts(total=100, free=60, cached=30, pinned=6, in_use=4),
        tree=TreeCounts(nodes=9, cached_tokens=500, evictable_tokens=400, pinned_tokens=100),
        running=1, waiting=0,
        tenants=MappingProxyType({"acme": TenantCounts(running=1, pinned_tokens=100),
                                  "globex": TenantCounts()}),
        evictions=MappingProxyType({"lru": 3}), top_prefixes=(),
        prefill_tokens_per_s=prefill_rate, kv_dtype="int8", kv_bytes_per_token=11880,
        steps=40, step_time_s=0.5, forward_time_s=0.4)


def usage(prompt: int, read: int, w5m: int = 0, w1h: int = 0, ttft_s: float | None = 0.05
          ) -> Usage:
    return Usage(prompt_tokens=prompt, cache_read_tokens=read, cache_creation_tokens=w5m + w1h,
                 cache_creation_5m_tokens=w5m, cache_creation_1h_tokens=w1h,
                 uncached_tokens=prompt - read - w5m - w1h, output_tokens=2, ttft_s=ttft_s)


@pytest.fixture
def book() -> UsageBook:
    clock = Clock()
    book = UsageBook(clock=clock)
    book.record("acme", usage(100, 0, w5m=60, w1h=30), ok=True)
    clock.now += 5
    book.record("acme", usage(100, 90), ok=True)
    clock.now += 5
    book.record("globex", usage(50, 0, w1h=40), ok=True)
    return book


def stats(book: UsageBook, tenant: str | None = None) -> dict:
    return build_stats(snapshot(), book, model="m", tenant=tenant, decode=None)


def test_tokens_split_cache_writes_by_ttl_overall_and_per_tenant(book):
    admin = stats(book)
    assert admin["tokens"]["cache_creation_5m"] == 60
    assert admin["tokens"]["cache_creation_1h"] == 70
    assert admin["tokens"]["cache_creation"] == 130
    assert admin["tenants"]["acme"]["tokens"]["cache_creation_1h"] == 30
    assert admin["tenants"]["globex"]["tokens"]["cache_creation_1h"] == 40
    assert admin["tenants"]["globex"]["tokens"]["cache_creation_5m"] == 0
    assert stats(book, "acme")["tokens"]["cache_creation_5m"] == 60


def test_each_tenant_entry_carries_its_own_history(book):
    tenants = stats(book)["tenants"]
    assert tenants["acme"]["history"] == [{"t": 0, "prompt": 100, "cache_read": 0},
                                          {"t": 5, "prompt": 100, "cache_read": 90}]
    assert tenants["globex"]["history"] == [{"t": 10, "prompt": 50, "cache_read": 0}]
    assert stats(book, "globex")["tenants"]["globex"]["history"] == tenants["globex"]["history"]


def test_tenants_get_the_prefill_rate_rounded_to_two_digits(book):
    assert stats(book)["prefill_tokens_per_s"] == 5432.1
    assert stats(book, "acme")["prefill_tokens_per_s"] == 5400.0
    slow = build_stats(snapshot(prefill_rate=87.65), book, model="m", tenant="acme", decode=None)
    assert slow["prefill_tokens_per_s"] == 88.0
    idle = build_stats(snapshot(prefill_rate=0.0), book, model="m", tenant="acme", decode=None)
    assert idle["prefill_tokens_per_s"] == 0.0


def test_percentiles_without_samples_are_null_not_zero(book):
    globex = stats(book, "globex")
    assert globex["ttft_ms"]["hit"] == {"p50": None, "p95": None}      # never hit the cache
    assert globex["ttft_ms"]["miss"] == {"p50": 50.0, "p95": 50.0}
    assert '"hit": {"p50": null, "p95": null}' in json.dumps(globex["ttft_ms"])
    empty = stats(UsageBook(clock=Clock()))
    assert empty["ttft_ms"]["miss"]["p95"] is None


def test_a_tenants_top_prefixes_come_from_its_own_list_not_the_server_wide_one(book):
    from dataclasses import replace

    from radixgate.runtime.engine.snapshot import PrefixEntry

    def entry(tenant, length, hits):
        return PrefixEntry(tenant, "ns-" + tenant, length, hits, 0.0, (1,) * length)
    server_wide = tuple(entry("globex", 40 + i, 9) for i in range(10))   # acme's fell off
    snap = replace(snapshot(), top_prefixes=server_wide,
                   tree=TreeCounts(9, 500, 400, 100, namespaces=7),
                   tenant_prefixes=MappingProxyType({"acme": (entry("acme", 12, 2),),
                                                     "globex": server_wide}))
    acme = build_stats(snap, book, model="m", tenant="acme", decode=None)
    assert acme["top_prefixes"] == [{"tenant": "acme", "tokens": 12, "hits": 2, "pin_ttl_s": 0.0}]
    assert acme["tree"]["namespaces"] == 0
    admin = build_stats(snap, book, model="m", tenant=None, decode=lambda ids: "text")
    assert [p["tenant"] for p in admin["top_prefixes"]] == ["globex"] * 10
    assert admin["tree"]["namespaces"] == 7


def test_kv_dtype_and_capacity_are_shown_to_admin_and_tenants(book):
    for scope in (None, "acme"):
        got = stats(book, scope)
        assert got["kv_dtype"] == "int8"
        assert got["capacity"] == {"blocks": 100, "tokens": 1600, "bytes_per_token": 11880,
                                   "bytes": 1600 * 11880, "replicas": 1,
                                   "bytes_per_replica": 1600 * 11880}


def test_engine_step_times_are_the_admins_only(book):
    assert stats(book)["engine"] == {"steps": 40, "step_s": 0.5, "forward_s": 0.4}
    assert stats(book, "acme")["engine"] == {"steps": 0, "step_s": 0.0, "forward_s": 0.0}


def test_spec_counts_are_the_admins_only_with_their_rates(book):
    from dataclasses import replace
    snap = replace(snapshot(), spec=MappingProxyType({"steps": 10, "drafted": 40, "accepted": 25}))
    admin = build_stats(snap, book, model="m", tenant=None, decode=None)["spec"]
    assert admin == {"verify_steps": 10, "drafted": 40, "accepted": 25,
                     "acceptance_rate": 0.625, "tokens_per_step": 3.5}
    tenant = build_stats(snap, book, model="m", tenant="acme", decode=None)["spec"]
    assert tenant == {"verify_steps": 0, "drafted": 0, "accepted": 0, "acceptance_rate": 0.0,
                      "tokens_per_step": 0.0}
