"""Load/soak (issue 8): many concurrent clients against ``radixgate serve --tiny`` with a
small KV budget (eviction and preemption happen): mixed tenants, both APIs, streaming and
not, ~10% mid-stream disconnects, ~5% malformed requests. Afterwards every request got a
complete answer or a clean error in its API's envelope (no 5xx but overloaded, nothing
hung), nothing is in use or locked, free + cached + pinned == total and the admin
integrity check is clean.

CI runs a short soak; ``make soak`` (``-m slow``) runs 60 s x 64 clients and a three-round
run that reports resident-memory drift.
"""
from __future__ import annotations

import json

import pytest

from benchmarks.soak import SoakResult, default_load, soak
from tests.support.server import ServerSpec, shared_server

SPEC = ServerSpec()


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


def assert_clean_soak(result: SoakResult, min_served: int) -> None:
    summary = result.summary()
    print(json.dumps(summary, indent=2))
    report = result.report
    assert report.violations == [], report.violations[:10]
    assert result.leaks == []
    assert result.log_errors == [], result.log_errors[:10]
    assert report.served >= min_served, summary
    assert report.outcomes["hung"] == 0
    assert report.outcomes["transport_error"] == 0, summary
    assert report.outcomes["disconnected"] > 0, "the load never disconnected mid-stream"
    assert report.outcomes["rejected_malformed"] > 0, "the load sent no malformed request"


async def test_short_soak_answers_every_request_cleanly_and_leaks_no_block(server):
    load = default_load(server.base_url, SPEC, seconds=15, clients=48, seed=7)
    result = await soak(server, load, rounds=1)
    assert_clean_soak(result, min_served=20)
    assert sum(result.final_stats["evictions"].values()) > 0, "KV budget never forced eviction"


@pytest.mark.slow
async def test_soak_60s_64_clients(server):
    load = default_load(server.base_url, SPEC, seconds=60, clients=64, seed=11)
    result = await soak(server, load, rounds=1)
    assert_clean_soak(result, min_served=100)


@pytest.mark.slow
async def test_resident_memory_flat_across_soak_rounds(server):
    load = default_load(server.base_url, SPEC, seconds=60, clients=64, seed=13)
    result = await soak(server, load, rounds=3)
    assert_clean_soak(result, min_served=300)
    first, last = result.rss_idle_mb[0], result.rss_idle_mb[-1]
    assert last - first < max(48.0, 0.10 * first), result.summary()
