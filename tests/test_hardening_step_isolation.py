"""Step isolation, engine side: a failure that belongs to one request fails that request
alone, wherever in the step it happens (admission, the batched forward pass), and the
other requests of the same step finish normally with nothing leaked."""
from radixgate.runtime.engine.api import ErrorKind, FinishReason
from radixgate.runtime.engine.scheduler import MAX_ADMISSION_FAILURES
from tests.support.engine_compare import assert_clean, greedy, held

SHARED = list(range(2000, 2060))


def submit_together(engine, requests):
    with held(engine):
        futures = [engine.submit_future(r) for r in requests]
    return [f.result(timeout=300) for f in futures]


def test_a_forward_failure_of_one_request_in_a_shared_step_fails_it_alone(make_engine):
    engine = make_engine()
    doomed, bystander = greedy(SHARED[:40]), greedy(list(range(3000, 3050)))
    engine.inject_fault(doomed.request_id).result()   # its forward raises, batched or alone
    results = submit_together(engine, [doomed, bystander])
    assert results[0].reason is FinishReason.ERROR
    assert results[0].error_kind is ErrorKind.INTERNAL
    assert results[1].reason is FinishReason.LENGTH
    assert_clean(engine)
    baseline = make_engine().generate(greedy(list(range(3000, 3050))))
    assert results[1].output_token_ids == baseline.output_token_ids   # the retry is exact


def test_an_admission_that_always_raises_fails_that_request_and_no_other(make_engine):
    engine = make_engine()
    blocks = engine.core.blocks
    real_may_fit, attempts = blocks.may_fit, []
    doomed, bystander = greedy(SHARED[:30]), greedy(list(range(3000, 3030)))

    def may_fit(seq, *args, **kwargs):
        if seq.request_id == doomed.request_id:
            attempts.append(1)
            raise RuntimeError("admission bug")
        return real_may_fit(seq, *args, **kwargs)

    blocks.may_fit = may_fit
    try:
        results = submit_together(engine, [doomed, bystander])
    finally:
        blocks.may_fit = real_may_fit
    assert results[0].reason is FinishReason.ERROR
    assert results[0].error_kind is ErrorKind.INTERNAL
    assert "admission bug" not in results[0].error_message
    assert len(attempts) == MAX_ADMISSION_FAILURES
    assert results[1].reason is FinishReason.LENGTH
    assert_clean(engine)
