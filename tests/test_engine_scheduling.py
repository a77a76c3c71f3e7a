"""Scheduling on the tiny model: shared-prefix waits, tenant fairness, longest-prefix-first,
per-tenant running quota, preemption, stop strings and tokens, seeds, fault isolation."""
import pytest

from radixgate.runtime.engine.api import ErrorKind, FinishReason, Request, SamplingParams
from radixgate.runtime.engine.engine_config import TenantQuota
from tests.support.engine import tiny_model
from tests.support.engine_compare import assert_clean, compare_greedy, greedy, held

SHARED = list(range(2000, 2100))   # a 100-token shared prefix




def _submit_held(engine, requests):
    with held(engine):
        futures = [engine.submit_future(r) for r in requests]
    return [f.result(timeout=300) for f in futures]


def _finish_order(engine, requests) -> list[str]:
    order = []
    with held(engine):
        futures = [engine.submit_future(r, on_event=lambda e: order.append(e.request_id)
                                        if getattr(e, "reason", None) else None)
                   for r in requests]
    for f in futures:
        f.result(timeout=300)
    return order


def test_second_waiting_request_with_same_prefix_waits_and_hits(make_engine):
    engine = make_engine()
    first, second = greedy(SHARED + [5, 6, 7]), greedy(SHARED + [8, 9])
    results = _submit_held(engine, [first, second])
    assert results[0].usage.cache_read_tokens == 0
    assert results[1].usage.cache_read_tokens == len(SHARED)
    assert sum(r.usage.computed_tokens for r in results) == len(SHARED) + 3 + 2
    assert_clean(engine)


def test_tenants_alternate_however_many_requests_one_queues(make_engine):
    engine = make_engine(max_num_seqs=1)
    flood = [greedy(SHARED[:10 + i], max_tokens=2, tenant="big", namespace="big") for i in range(5)]
    lone = greedy(SHARED[:30], max_tokens=2, tenant="small", namespace="small")
    order = _finish_order(engine, flood + [lone])
    assert order.index(lone.request_id) == 1
    assert_clean(engine)


def test_longest_cached_prefix_goes_first_within_a_tenant(make_engine):
    engine = make_engine(max_num_seqs=1)
    engine.generate(greedy(SHARED, max_tokens=1))
    cold = greedy(list(range(5000, 5060)), max_tokens=2)
    warm = greedy(SHARED + [1, 2, 3], max_tokens=2)
    order = _finish_order(engine, [cold, warm])
    assert order == [warm.request_id, cold.request_id]


def test_tenant_running_quota_caps_its_concurrency(make_engine):
    engine = make_engine(tenant_quotas={"capped": TenantQuota(max_running=1)})
    peaks = {"capped": 0, "free": 0}
    scheduler = engine.core.scheduler
    original = scheduler.schedule

    def recording_schedule():
        plan = original()
        for tenant in peaks:
            peaks[tenant] = max(peaks[tenant], scheduler.running_by_tenant.get(tenant, 0))
        return plan

    scheduler.schedule = recording_schedule
    requests = [greedy(SHARED[:20 + i], max_tokens=4, tenant=t, namespace=t)
                for i in range(3) for t in ("capped", "free")]
    results = _submit_held(engine, requests)
    assert all(r.reason is FinishReason.LENGTH for r in results)
    assert peaks == {"capped": 1, "free": 3}


def test_preemption_under_a_tiny_kv_budget_keeps_greedy_outputs(make_engine):
    reference = make_engine(enable_prefix_cache=False, record_logits=True)
    engine = make_engine(num_blocks=12, record_logits=True)   # 192 slots for 4 x 70 tokens
    prompts = [SHARED[:30] + [7000 + i] for i in range(4)]
    expected = [reference.generate(greedy(p, max_tokens=40)) for p in prompts]
    results = _submit_held(engine, [greedy(p, max_tokens=40) for p in prompts])
    assert engine.request_snapshot().result().preemptions > 0
    for got, ref in zip(results, expected):
        compare_greedy(engine, got, reference, ref, logit_tol=1e-3)
    assert_clean(engine)


def test_stop_string_across_token_boundary_ends_text_before_it(make_engine):
    engine = make_engine()
    plain = engine.generate(greedy(SHARED, max_tokens=12))
    tokenizer = tiny_model().tokenizer
    pieces = [tokenizer.decode([t]) for t in plain.output_token_ids]
    start = len(pieces[0]) + len(pieces[1]) + len(pieces[2]) - 1   # last char of token 3 ...
    stop = plain.text[start:start + 3]                               # ... and what follows
    assert len(stop) == 3
    deltas = []
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop=(stop,))
    stopped = engine.submit_future(Request(SHARED, params),
                                   on_event=lambda e: deltas.append(getattr(e, "text", ""))
                                   if not hasattr(e, "reason") else None).result(60)
    assert stopped.reason is FinishReason.STOP_SEQUENCE and stopped.stop_sequence == stop
    assert stopped.text == plain.text[:plain.text.index(stop)] == "".join(deltas)
    assert_clean(engine)


def test_stop_token_id_ends_without_its_text(make_engine):
    engine = make_engine()
    plain = engine.generate(greedy(SHARED, max_tokens=8))
    stop_id = plain.output_token_ids[3]
    first_hit = plain.output_token_ids.index(stop_id)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, stop_token_ids=(stop_id,))
    stopped = engine.generate(Request(SHARED, params))
    assert stopped.reason is FinishReason.EOS
    assert stopped.output_token_ids == plain.output_token_ids[:first_hit + 1]
    tokenizer = tiny_model().tokenizer
    assert stopped.text == tokenizer.decode(plain.output_token_ids[:first_hit])


def test_seeded_sampling_reproduces_alone_and_in_a_batch(make_engine):
    engine = make_engine()
    seeded = SamplingParams(max_tokens=10, temperature=1.0, seed=1234, ignore_eos=True)
    alone = engine.generate(Request(SHARED, seeded))
    crowd = [Request(SHARED[:40] + [i], SamplingParams(max_tokens=10, temperature=1.0, ignore_eos=True))
             for i in range(3)]
    batch = _submit_held(engine, crowd + [Request(SHARED, seeded)])
    other_seed = engine.generate(Request(SHARED, SamplingParams(max_tokens=10, temperature=1.0,
                                                                 seed=99, ignore_eos=True)))
    assert batch[-1].output_token_ids == alone.output_token_ids
    assert other_seed.output_token_ids != alone.output_token_ids


def test_deltas_always_rebuild_the_final_text(make_engine):
    engine = make_engine()
    texts = {}

    def collect(event):
        if not hasattr(event, "reason"):
            texts.setdefault(event_ids[0], []).append(event.text)

    for seed in range(3):
        event_ids = [f"utf8-{seed}"]
        params = SamplingParams(max_tokens=24, temperature=2.0, seed=seed, ignore_eos=True)
        done = engine.generate(Request(SHARED, params, request_id=event_ids[0]), on_event=collect)
        assert "".join(texts.get(event_ids[0], [])) == done.text


def test_fault_fails_only_that_steps_requests_and_the_engine_keeps_serving(make_engine):
    engine = make_engine(max_num_seqs=1)
    victim, bystander = greedy(SHARED[:50]), greedy(SHARED[:60])
    engine.inject_fault(victim.request_id).result()
    results = _submit_held(engine, [victim, bystander])
    assert results[0].reason is FinishReason.ERROR and results[0].error_kind is ErrorKind.INTERNAL
    assert results[1].reason is FinishReason.LENGTH
    assert_clean(engine)
    assert engine.generate(greedy(SHARED[:50])).reason is FinishReason.LENGTH


def test_fault_in_a_shared_step_fails_every_request_of_that_step(make_engine):
    engine = make_engine()
    first, second = greedy(SHARED[:40]), greedy(list(range(3000, 3040)))
    engine.inject_fault().result()
    results = _submit_held(engine, [first, second])
    assert [r.error_kind for r in results] == [ErrorKind.INTERNAL] * 2
    assert engine.request_snapshot().result().errors == 2
    assert_clean(engine)


def test_memory_pressure_trims_a_cached_prompt_instead_of_dropping_it(make_engine):
    reference = make_engine(enable_prefix_cache=False, record_logits=True)
    engine = make_engine(num_blocks=12, record_logits=True)       # 192 token slots
    long_prompt = list(range(3000, 3150))                          # 150 tokens: 10 blocks
    engine.generate(greedy(long_prompt, max_tokens=1))
    engine.generate(greedy(list(range(6000, 6080)), max_tokens=4))  # needs ~5 more blocks
    again = engine.generate(greedy(long_prompt, max_tokens=8))
    kept = again.usage.cache_read_tokens
    assert 0 < kept < len(long_prompt) and kept % 16 == 0          # a block-aligned prefix
    compare_greedy(engine, again, reference, reference.generate(greedy(long_prompt, max_tokens=8)),
                   logit_tol=1e-3)
    assert_clean(engine)
