"""Load/soak: many concurrent clients against ``radixgate serve --tiny`` with a
small KV budget (eviction and preemption happen): mixed tenants, both APIs, streaming and
not, ~10% mid-stream disconnects, ~5% malformed requests. Afterwards every request got a
complete answer or a clean error in its API's envelope (no 5xx but overloaded, nothing
hung), nothing is in use or locked, free + cached + pinned == total and the admin
integrity check is clean.

CI runs a short soak; ``make soak`` (``-m slow``) runs 60 s x 64 clients and a three-round
run that reports resident-memory drift.

Salt churn (``benchmarks.soak.salt_churn``): one tenant sends thousands of requests, each
under a cache_salt never seen before and a prompt of a new length; the server's VmRSS may
grow by no more than max(48 MB, 10%) over the second half of the churn. CI runs 3,000
requests against a fresh tiny server (~20 s); ``make soak`` 20,000, and 1,200 against the
default model (its real KV and matmul sizes).
"""
from __future__ import annotations

import asyncio
import json
import random

import aiohttp
import pytest

from benchmarks.launch import bench_spec
from benchmarks.soak import CHURN_TENANT, ChurnResult, SoakResult, default_load, salt_churn, soak
from tests.support import client as c
from tests.support.inproc import engine_of, in_process_gateway
from tests.support.load import run_load
from tests.support.server import ADMIN_KEY, ServerProcess, ServerSpec, shared_server, tenant_key

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


def message_usage(stream: bool, text: str) -> dict:
    """The final usage of a /v1/messages answer (streams: message_start merged with message_delta)."""
    if not stream:
        return json.loads(text)["usage"]
    events = c.parse_sse(text)
    start = json.loads(events[0][1])["message"]["usage"]
    delta = [json.loads(d) for name, d in events if name == "message_delta"][0]["usage"]
    return {**start, **delta}


async def test_usage_adds_up_to_the_prompt_under_memory_pressure(server):
    """40 concurrent requests sharing a system prompt overfill the KV budget (eviction,
    preemption, shared-prefix waits); each one's input + cache read + cache creation still
    equals its prompt length as count_tokens reports it."""
    rng = random.Random(5)
    shared = c.words(rng, 80)
    bodies = [c.anthropic_body(c.words(rng, rng.randint(5, 150)), system=shared,
                               max_tokens=rng.randint(20, 120), stream=i % 2 == 0)
              for i in range(40)]
    key = tenant_key("delta")
    async with aiohttp.ClientSession() as http:
        counts = []
        for body in bodies:
            status, counted = await c.post_json(http, server.base_url + "/v1/messages/count_tokens",
                                                key, {k: body[k] for k in ("model", "system", "messages")})
            assert status == 200, counted
            counts.append(counted["input_tokens"])

        async def send(body):
            async with http.post(server.base_url + c.ANTHROPIC_PATH, headers=c.headers(key),
                                 json=body) as r:
                return r.status, await r.text()

        answers = await asyncio.gather(*(send(b) for b in bodies))
        for body, prompt_tokens, (status, text) in zip(bodies, counts, answers):
            assert c.check_answer(c.ANTHROPIC_PATH, body["stream"], status, text,
                                  body["max_tokens"]) is None
            usage = message_usage(body["stream"], text)
            assert usage["input_tokens"] + usage["cache_read_input_tokens"] + \
                usage["cache_creation_input_tokens"] == prompt_tokens, usage
        stats = await c.wait_quiescent(http, server.base_url, ADMIN_KEY)
        assert c.block_accounting_violation(stats) is None


async def test_soak_load_preempts_and_evicts_yet_every_answer_is_clean_in_process():
    """The same load against the app in process, where the engine's counters are readable:
    the KV budget really forces preemption (decodes outgrow it) and eviction."""
    async with in_process_gateway(cache={"kv_dtype": "float32"}) as (base_url, app):  # its tokens
        load = default_load(base_url, SPEC, seconds=10, clients=48, seed=21)
        report = await run_load(load)
        snapshot = engine_of(app).request_snapshot().result(timeout=30)
        async with aiohttp.ClientSession() as http:
            stats = await c.wait_quiescent(http, base_url, ADMIN_KEY)
            assert c.block_accounting_violation(stats) is None
            assert await c.integrity_violation(http, base_url, ADMIN_KEY) is None
    assert report.violations == [], report.violations[:10]
    assert report.served > 0
    assert snapshot.preemptions > 0, "the load never preempted: the KV budget is too large"
    assert snapshot.evictions.get("lru", 0) > 0


def assert_flat_under_churn(result: ChurnResult) -> None:
    """Every answer clean, and the second half of the churn grew VmRSS by at most
    max(48 MB, 10%) (per-namespace and per-shape state is bounded, not kept per salt)."""
    summary = result.summary()
    print(json.dumps(summary))
    assert result.failures == [], result.failures[:5]
    assert result.second_half_growth_mb < summary["limit_mb"], summary


@pytest.fixture
def fresh_server(tmp_path):
    """A tiny server of its own: the churn measures growth from a known start."""
    proc = ServerProcess(SPEC, tmp_path).start()
    yield proc
    proc.stop()


async def test_salt_churn_keeps_resident_memory_flat(fresh_server):
    result = await salt_churn(fresh_server.base_url, fresh_server.proc.pid, 3000, seed=3)
    assert result.requests == 3000
    assert_flat_under_churn(result)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_salt_churn_20k_keeps_resident_memory_flat(fresh_server):
    result = await salt_churn(fresh_server.base_url, fresh_server.proc.pid, 20000, seed=4)
    assert_flat_under_churn(result)


@pytest.mark.slow
@pytest.mark.realmodel
@pytest.mark.timeout(900)
async def test_salt_churn_on_the_default_model_keeps_resident_memory_flat():
    """At the default model's sizes one cached matmul shape costs ~0.5-0.9 MB: before the
    caches were bounded, a churn like this grew the server 647 -> 1,838 MB by request 1,200
    and on to 2,289 MB by 2,100."""
    server = ServerProcess(bench_spec(tenants=[CHURN_TENANT], kv_cache_gb=0.25,
                                      max_model_len=2048)).start()
    try:
        result = await salt_churn(server.base_url, server.proc.pid, 1200, max_words=300,
                                  key=tenant_key(CHURN_TENANT), seed=5)
    finally:
        server.stop()
    assert_flat_under_churn(result)
