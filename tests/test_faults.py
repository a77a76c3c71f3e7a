"""Fault tolerance at the engine, in process over the tiny model: a request larger
than the whole KV budget is rejected at submission, a full waiting queue answers OVERLOADED,
and an exception injected into one engine step fails only that step's requests (caching
nothing of theirs) while the engine keeps serving. HTTP-level counterparts, and the slow
reader, live in test_faults_http.py.
"""
from __future__ import annotations

from radixgate.runtime.engine.api import ErrorKind, FinishReason
from tests.support.engine import finish, first_delta, integrity, request, running_engine

PROMPT = list(range(1000, 1040))


def distinct_prompt(i: int, n: int = 40) -> list[int]:
    return [2000 + 97 * i + j for j in range(n)]


async def test_injected_step_fault_fails_only_that_steps_request_and_engine_keeps_serving():
    with running_engine(max_num_seqs=1) as engine:   # one request per step: steps are known
        doomed = request(distinct_prompt(0), max_tokens=6)
        engine.inject_fault(doomed.request_id).result(timeout=30)
        handles = [engine.submit(doomed)]
        handles += [engine.submit(request(distinct_prompt(i), max_tokens=6)) for i in (1, 2)]
        results = [await finish(h) for h in handles]
        assert results[0].reason is FinishReason.ERROR
        assert results[0].error_kind is ErrorKind.INTERNAL
        assert results[0].error_message == (
            f"internal error while generating (request id {doomed.request_id})")
        assert [r.reason for r in results[1:]] == [FinishReason.LENGTH] * 2
        assert [len(r.output_token_ids) for r in results[1:]] == [6, 6]
        after = await finish(engine.submit(request(distinct_prompt(3), max_tokens=3)))
        assert after.reason is FinishReason.LENGTH
        counts = integrity(engine)
        assert counts["free"] + counts["held"] == counts["total"]
        assert counts["locks"] == 0 and counts["running"] == 0


async def test_injected_fault_in_a_batched_step_fails_the_batch_but_not_later_requests():
    with running_engine(max_num_seqs=8) as engine:
        first = engine.submit(request(distinct_prompt(0), max_tokens=40))
        await first_delta(first)                      # decoding now
        engine.inject_fault().result(timeout=30)      # the very next step raises
        failed = await finish(first)
        assert failed.reason is FinishReason.ERROR and failed.error_kind is ErrorKind.INTERNAL
        later = [engine.submit(request(distinct_prompt(i), max_tokens=5)) for i in (1, 2, 3)]
        assert [(await finish(h)).reason for h in later] == [FinishReason.LENGTH] * 3
        counts = integrity(engine)
        assert counts["locks"] == 0 and counts["free"] + counts["held"] == counts["total"]


async def test_failed_step_caches_nothing_of_the_failed_request():
    """A failed step's K/V may be garbage: a retry of the same prompt must not hit it."""
    with running_engine(max_num_seqs=1) as engine:
        doomed = request(PROMPT, max_tokens=4)
        engine.inject_fault(doomed.request_id).result(timeout=30)
        assert (await finish(engine.submit(doomed))).reason is FinishReason.ERROR
        retry = await finish(engine.submit(request(PROMPT, max_tokens=4)))
        assert retry.reason is FinishReason.LENGTH
        assert retry.usage.cache_read_tokens == 0


async def test_request_larger_than_whole_kv_budget_is_rejected_at_submission():
    with running_engine(num_blocks=8, block_size=16, max_model_len=1024) as engine:
        huge = request([3000 + (i % 500) for i in range(8 * 16 + 40)], max_tokens=4)
        result = await finish(engine.submit(huge), timeout_s=10)
        assert result.reason is FinishReason.ERROR
        assert result.error_kind is ErrorKind.TOO_LONG
        fits = await finish(engine.submit(request(PROMPT, max_tokens=4)))
        assert fits.reason is FinishReason.LENGTH


async def test_full_waiting_queue_answers_overloaded_and_admitted_requests_finish():
    with running_engine(max_num_seqs=1, max_queue=2) as engine:
        running = engine.submit(request(distinct_prompt(0), max_tokens=30))
        await first_delta(running)
        handles = [engine.submit(request(distinct_prompt(i), max_tokens=2)) for i in range(1, 7)]
        results = [await finish(h) for h in handles]
        reasons = [(r.reason, r.error_kind) for r in results]
        assert reasons[:2] == [(FinishReason.LENGTH, None)] * 2
        assert reasons[2:] == [(FinishReason.ERROR, ErrorKind.OVERLOADED)] * 4
        assert (await finish(running)).reason is FinishReason.LENGTH
        assert integrity(engine)["locks"] == 0
