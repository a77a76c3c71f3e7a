"""Engine basics on the tiny model: events, prefix reuse and usage, rejections, deadlines,
pins and public prefixes, snapshots, shutdown."""
import asyncio
import threading
import time

import pytest

from radixgate.runtime.engine.api import (Breakpoint, ErrorKind, FinishReason, Request, SamplingParams,
                                   TextDelta)
from radixgate.runtime.engine.engine_config import TenantQuota
from tests.support.engine_compare import assert_clean, greedy, held

PROMPT = list(range(1000, 1100))   # 100 tokens: 6 full blocks + 4




def test_second_identical_request_reads_all_but_the_last_prompt_token(make_engine):
    engine = make_engine()
    first = engine.generate(greedy(PROMPT))
    second = engine.generate(greedy(PROMPT))
    assert first.usage.cache_read_tokens == 0 and first.usage.uncached_tokens == 100
    assert second.usage.cache_read_tokens == 99 and second.usage.uncached_tokens == 1
    assert second.usage.computed_tokens == 1
    assert second.output_token_ids == first.output_token_ids
    assert_clean(engine)


def test_disabled_prefix_cache_computes_everything(make_engine):
    engine = make_engine(enable_prefix_cache=False)
    engine.generate(greedy(PROMPT))
    again = engine.generate(greedy(PROMPT))
    assert again.usage.cache_read_tokens == 0
    assert engine.request_snapshot().result().tree.nodes == 0
    assert_clean(engine)


def test_page_rounded_match_reuses_whole_blocks_only(make_engine):
    engine = make_engine(page_rounded_match=True)
    engine.generate(greedy(PROMPT))
    again = engine.generate(greedy(PROMPT))
    assert again.usage.cache_read_tokens == 96
    # like a hash-block cache it keeps whole blocks only: prompt + output, rounded down
    snapshot = engine.request_snapshot().result()
    assert snapshot.tree.cached_tokens % snapshot.block_size == 0
    assert snapshot.tree.cached_tokens >= 96
    assert_clean(engine)


async def test_async_stream_yields_deltas_then_one_finished(make_engine):
    engine = make_engine()
    handle = engine.submit(greedy(PROMPT, max_tokens=12))
    events = [event async for event in handle]
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert events[-1] is handle.finished and len(events) == len(deltas) + 1
    assert handle.finished.reason is FinishReason.LENGTH
    assert "".join(d.text for d in deltas) == handle.finished.text
    assert len(handle.finished.output_token_ids) == 12
    assert handle.finished.usage.ttft_s is not None and handle.finished.usage.output_tokens == 12


async def test_abort_mid_decode_ends_with_aborted_and_caches_the_output(make_engine):
    engine = make_engine()
    handle = engine.submit(greedy(PROMPT, max_tokens=500))
    await asyncio.wait_for(handle.__anext__(), 60)
    handle.abort()
    finished = await asyncio.wait_for(handle.result(), 60)
    assert finished.reason is FinishReason.ABORTED
    assert 1 <= len(finished.output_token_ids) < 500
    assert_clean(engine)
    resumed = engine.generate(greedy(PROMPT + list(finished.output_token_ids)))
    assert resumed.usage.cache_read_tokens == len(PROMPT) + len(finished.output_token_ids) - 1


def test_prompt_over_context_window_is_rejected_too_long(make_engine):
    engine = make_engine(max_model_len=120)
    finished = engine.generate(greedy(PROMPT, max_tokens=30))
    assert finished.reason is FinishReason.ERROR and finished.error_kind is ErrorKind.TOO_LONG
    assert "context window" in finished.error_message


def test_request_that_could_never_fit_the_kv_budget_is_rejected(make_engine):
    engine = make_engine(num_blocks=8)   # 128 token slots
    finished = engine.generate(greedy(PROMPT, max_tokens=40))
    assert finished.error_kind is ErrorKind.TOO_LONG and "KV blocks" in finished.error_message
    assert engine.generate(greedy(PROMPT, max_tokens=20)).reason is FinishReason.LENGTH


@pytest.mark.parametrize("params", [SamplingParams(temperature=-1.0), SamplingParams(top_p=0.0),
                                    SamplingParams(max_tokens=0), SamplingParams(top_k=-1)])
def test_bad_sampling_values_are_bad_requests(make_engine, params):
    engine = make_engine()
    finished = engine.generate(Request(PROMPT, params))
    assert finished.error_kind is ErrorKind.BAD_REQUEST and finished.error_message


def test_empty_prompt_and_unknown_token_ids_are_bad_requests(make_engine):
    engine = make_engine()
    assert engine.generate(greedy([])).error_kind is ErrorKind.BAD_REQUEST
    assert engine.generate(greedy([10**7])).error_kind is ErrorKind.BAD_REQUEST


def test_full_waiting_queue_rejects_overloaded(make_engine):
    engine = make_engine(max_queue=2, max_num_seqs=1)
    requests = [greedy(PROMPT[:20 + i], max_tokens=2) for i in range(4)]
    with held(engine):
        futures = [_generate_later(engine, r) for r in requests]
    results = [f.result(timeout=120) for f in futures]
    kinds = [r.error_kind for r in results]
    assert kinds.count(ErrorKind.OVERLOADED) == 2 and kinds.count(None) == 2
    assert_clean(engine)


def test_tenant_queue_quota_rejects_over_capacity(make_engine):
    engine = make_engine(max_num_seqs=1, tenant_quotas={"small": TenantQuota(max_queued=1)})
    requests = [greedy(PROMPT[:20 + i], max_tokens=2, tenant="small") for i in range(3)]
    with held(engine):
        futures = [_generate_later(engine, r) for r in requests]
    kinds = [f.result(timeout=120).error_kind for f in futures]
    assert kinds == [None, ErrorKind.OVER_CAPACITY, ErrorKind.OVER_CAPACITY]


def test_passed_deadline_times_out(make_engine):
    engine = make_engine()
    late = greedy(PROMPT, deadline=time.monotonic() - 1)
    finished = engine.generate(late)
    assert finished.reason is FinishReason.ERROR and finished.error_kind is ErrorKind.TIMEOUT


def test_deadline_during_decode_stops_the_request_and_frees_its_blocks(make_engine):
    engine = make_engine(max_model_len=1024)
    finished = engine.generate(greedy(PROMPT, max_tokens=900, deadline=time.monotonic() + 0.5))
    assert finished.error_kind is ErrorKind.TIMEOUT
    assert len(finished.output_token_ids) < 900
    assert_clean(engine)


def test_breakpoints_pin_prefixes_and_split_creation_by_ttl(make_engine):
    engine = make_engine()
    points = (Breakpoint(32, 3600.0), Breakpoint(64, 300.0))
    first = engine.generate(greedy(PROMPT, breakpoints=points, tenant="acme", namespace="a"))
    usage = first.usage
    assert (usage.cache_creation_1h_tokens, usage.cache_creation_5m_tokens) == (32, 32)
    assert usage.uncached_tokens == 36 and usage.cache_creation_tokens == 64
    snap = engine.request_snapshot().result()
    assert snap.tenants["acme"].pinned_tokens == 64 and snap.blocks.pinned > 0
    second = engine.generate(greedy(PROMPT, breakpoints=points, tenant="acme", namespace="a"))
    assert second.usage.cache_read_tokens == 99 and second.usage.cache_creation_tokens == 0
    assert engine.flush().result() > 0
    assert engine.request_snapshot().result().tenants["acme"].pinned_tokens == 0
    assert_clean(engine)


def test_pinned_token_quota_skips_pins_beyond_it(make_engine):
    engine = make_engine(tenant_quotas={"acme": TenantQuota(max_pinned_tokens=40)})
    points = (Breakpoint(32, 3600.0), Breakpoint(64, 300.0))
    engine.generate(greedy(PROMPT, breakpoints=points, tenant="acme", namespace="a"))
    assert engine.request_snapshot().result().tenants["acme"].pinned_tokens == 32


def test_published_prefix_is_reused_only_by_tenants_that_opt_in(make_engine):
    engine = make_engine()
    published = engine.publish(PROMPT[:64], ttl_s=600).result(timeout=60)
    assert published.reason is FinishReason.LENGTH
    opted = engine.generate(greedy(PROMPT, tenant="t1", namespace="n1", use_public=True))
    other = engine.generate(greedy(PROMPT, tenant="t2", namespace="n2"))
    assert opted.usage.cache_read_tokens == 64 and other.usage.cache_read_tokens == 0
    again = engine.generate(greedy(PROMPT, tenant="t1", namespace="n1", use_public=True))
    assert again.usage.cache_read_tokens == 99    # its continuation landed in its namespace
    assert_clean(engine)


def test_snapshot_block_states_add_up_to_total(make_engine):
    engine = make_engine()
    engine.generate(greedy(PROMPT, breakpoints=(Breakpoint(48, 60.0),)))
    snap = engine.request_snapshot().result()
    b = snap.blocks
    assert b.free + b.cached + b.pinned + b.in_use == b.total == 128
    assert snap.tree.cached_tokens >= 100 and snap.top_prefixes
    assert snap.top_prefixes[0].tenant == "default" and snap.prefill_tokens_per_s > 0


def test_shutdown_aborts_running_and_refuses_new_requests(make_engine):
    engine = make_engine(max_model_len=1024)
    future = _generate_later(engine, greedy(PROMPT, max_tokens=900))
    time.sleep(0.2)
    engine.shutdown(grace_s=0)
    assert future.result(timeout=60).reason is FinishReason.ABORTED
    late = engine.generate(greedy(PROMPT))
    assert late.error_kind is ErrorKind.OVERLOADED


def test_shutdown_with_grace_lets_running_requests_finish_then_stops(make_engine):
    engine = make_engine()
    stopper = threading.Thread(target=engine.shutdown, kwargs={"grace_s": 60})
    with held(engine):
        future = _generate_later(engine, greedy(PROMPT, max_tokens=3))
        stopper.start()
        time.sleep(0.2)                  # the drain command queues behind the request
    assert future.result(timeout=60).reason is FinishReason.LENGTH
    stopper.join(timeout=60)
    assert not stopper.is_alive() and engine.snapshot().draining


def _generate_later(engine, request):
    """Queues the request now (before returning); the Future resolves to its Finished."""
    return engine.submit_future(request)


def test_integrity_command_reports_a_leaked_reference(make_engine):
    engine = make_engine(debug_integrity=True)
    engine.generate(greedy(PROMPT))
    block = min(engine._command(engine.core.tree.held_blocks).result())   # read on its thread
    engine._command(engine.core.pool.incref, block).result()        # a reference nobody holds
    with pytest.raises(AssertionError, match=f"block {block}"):
        engine.check_integrity().result(timeout=60)
    engine._command(engine.core.pool.decref, block).result()
    assert_clean(engine)
