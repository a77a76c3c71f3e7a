"""Constrained decoding in the engine (tiny model: random weights, the real vocabulary, so the
masks are the real ones): outputs match their grammar, free rows of a mixed batch are not
touched, jump-forward changes nothing but the step count, the grammar wins over
min_tokens, blocks are conserved."""
from __future__ import annotations

import json
import logging
import re
import threading

import jsonschema
import pytest
import torch

from radixgate.runtime.engine.api import FinishReason, Request, SamplingParams, TextDelta
from radixgate.runtime.engine.grammar import (GrammarCompiler, GrammarError, choice_grammar,
                                       json_grammar, regex_grammar)
from radixgate.runtime.engine.sampling import TokenMasks, sample_tokens
from radixgate.runtime.engine.grammar_masks import compute_masks
from tests.support.engine import integrity, running_engine, tiny_model

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["city", "unit", "days"],
          "properties": {"city": {"type": "string", "maxLength": 12},
                         "unit": {"enum": ["celsius", "fahrenheit"]},
                         "days": {"type": "integer", "minimum": 1, "maximum": 14},
                         "hourly": {"type": "boolean"}}}


@pytest.fixture(scope="module")
def compiler():
    model = tiny_model()
    return GrammarCompiler(model.tokenizer, model.config.vocab_size)


def constrained(grammar, prompt: str, **sampling) -> Request:
    sampling.setdefault("max_tokens", 64)
    return Request(tiny_model().tokenizer.encode(prompt), SamplingParams(**sampling),
                   tenant="acme", namespace="ns-acme", grammar=grammar.matcher())


def free(prompt: str, **sampling) -> Request:
    sampling.setdefault("max_tokens", 12)
    sampling.setdefault("temperature", 0.0)
    return Request(tiny_model().tokenizer.encode(prompt), SamplingParams(**sampling),
                   tenant="acme", namespace="ns-acme")


def test_json_schema_outputs_validate_greedy_and_sampled(compiler):
    grammar = compiler.compile(json_grammar(SCHEMA))
    with running_engine() as engine:
        for i, temperature in enumerate((0.0, 0.7, 1.0, 1.3)):
            done = engine.generate(constrained(grammar, f"Weather {i}?", temperature=temperature,
                                               seed=i))
            assert done.reason is FinishReason.EOS, done
            jsonschema.validate(json.loads(done.text), SCHEMA)
        integrity(engine)
        assert engine.check_integrity().result()["running"] == 0


def test_regex_and_choice_outputs_match(compiler):
    regex = compiler.compile(regex_grammar(r"[A-Z]{2}-[0-9]{3}"))
    pick = compiler.compile(choice_grammar(["red", "green", "blue"]))
    with running_engine() as engine:
        for temperature in (0.0, 1.0):
            done = engine.generate(constrained(regex, "code", temperature=temperature, seed=4))
            assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", done.text), done.text
            assert engine.generate(constrained(pick, "color", temperature=temperature)
                                   ).text in ("red", "green", "blue")
        integrity(engine)


def submit_noting_steps(engine, request: Request, steps: dict[str, set[int]]):
    """``submit_future`` whose ``on_event`` notes the engine steps that gave the request
    tokens (read on the engine thread, where ``counters.steps`` counts the running step)."""
    noted = steps.setdefault(request.request_id, set())

    def record(event):
        if isinstance(event, TextDelta) and event.token_ids:
            noted.add(engine.core.counters.steps)
    return engine.submit_future(request, record)


def test_free_rows_of_a_mixed_batch_are_untouched(compiler):
    grammar = compiler.compile(json_grammar(SCHEMA))
    with running_engine() as engine:
        alone = engine.generate(free("The free request"))
        steps: dict[str, set[int]] = {}
        jsons = [constrained(grammar, f"Mixed {i}", temperature=1.0, seed=i) for i in range(3)]
        futures = [submit_noting_steps(engine, r, steps) for r in jsons]
        free_request = free("The free request")
        mixed = submit_noting_steps(engine, free_request, steps)
        for future in futures:
            jsonschema.validate(json.loads(future.result(timeout=120).text), SCHEMA)
        assert mixed.result(timeout=120).output_token_ids == alone.output_token_ids
        shared = steps[free_request.request_id] & set().union(
            *(steps[r.request_id] for r in jsons))
        assert len(shared) >= 5, steps           # the free row was sampled beside masked rows
        integrity(engine)


class FailsOnce:
    """A request grammar whose ``at``-th mask fill raises (then behaves)."""

    def __init__(self, inner, at: int):
        self.inner, self.at, self.fills = inner, at, 0

    def fill_mask(self, pointer: int, num_bytes: int) -> None:
        self.fills += 1
        if self.fills == self.at:
            raise RuntimeError("injected mask failure")
        self.inner.fill_mask(pointer, num_bytes)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_failed_overlapped_mask_leaves_the_step_retryable(compiler, caplog):
    """The masks are computed on the worker thread during the forward (forced on: CI has
    no spare core) and fail once in a step of two rows: both rows are retried alone from
    the right position, so the free one answers as it does alone and the constrained one
    still matches its schema."""
    grammar = compiler.compile(json_grammar(SCHEMA))
    with running_engine() as engine:
        alone = engine.generate(free("The free request", max_tokens=16))
        engine.core.grammar_masks.overlap = True
        flaky = FailsOnce(grammar.matcher(), at=2)
        request = Request(tiny_model().tokenizer.encode("Weather?"),
                          SamplingParams(max_tokens=64, temperature=0.0), tenant="acme",
                          namespace="ns-acme", grammar=flaky)
        with caplog.at_level(logging.WARNING):
            json_done = engine.submit_future(request)
            free_done = engine.submit_future(free("The free request", max_tokens=16))
            answer, mixed = json_done.result(timeout=120), free_done.result(timeout=120)
        assert any(t.name.startswith("grammar-masks")             # the overlapped path ran
                   for t in threading.enumerate())
        assert flaky.fills > 2 and "a step of 2 requests failed" in caplog.text
        assert mixed.output_token_ids == alone.output_token_ids, mixed
        assert answer.reason is FinishReason.EOS, answer
        jsonschema.validate(json.loads(answer.text), SCHEMA)
        integrity(engine)


def test_jump_forward_keeps_the_greedy_output_in_fewer_steps(compiler):
    grammar = compiler.compile(json_grammar(SCHEMA))
    results = {}
    for jump in (True, False):
        with running_engine(jump_forward=jump) as engine:
            done = engine.generate(constrained(grammar, "Weather in Rome?", temperature=0.0))
            steps = engine.request_snapshot().result(timeout=30).steps
            results[jump] = (done.output_token_ids, done.text, steps)
            integrity(engine)
    assert results[True][1] == results[False][1]
    assert results[True][2] < results[False][2]


def test_grammar_wins_over_min_tokens_and_ignore_eos(compiler):
    pick = compiler.compile(choice_grammar(["yes", "no"]))
    with running_engine() as engine:
        done = engine.generate(constrained(pick, "Answer", max_tokens=50, min_tokens=40,
                                           ignore_eos=True, temperature=1.0))
        assert done.reason is FinishReason.EOS and done.text in ("yes", "no")


def test_constrained_request_reuses_a_free_requests_cached_prefix(compiler):
    grammar = compiler.compile(json_grammar(SCHEMA))
    prompt = "A shared system prompt that is long enough to fill a few blocks. " * 4
    with running_engine() as engine:
        engine.generate(free(prompt))
        done = engine.generate(constrained(grammar, prompt, temperature=0.0))
        assert done.usage.cache_read_tokens > 0
        jsonschema.validate(json.loads(done.text), SCHEMA)
        integrity(engine)


def test_cut_by_max_tokens_reports_length(compiler):
    grammar = compiler.compile(json_grammar(SCHEMA))
    with running_engine() as engine:
        done = engine.generate(constrained(grammar, "Weather?", max_tokens=3, temperature=0.0))
        assert done.reason is FinishReason.LENGTH and len(done.output_token_ids) == 3


@pytest.mark.parametrize("source, named", [
    (json_grammar({"type": "strin"}), "strin"),
    (json_grammar({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}), "not"),
    ("start: missing_rule", "missing_rule"),
])
def test_bad_grammars_raise_naming_the_problem(compiler, source, named):
    with pytest.raises(GrammarError, match=named):
        compiler.compile(source)


def test_a_regex_over_the_limit_is_refused():
    with pytest.raises(GrammarError, match="at most"):
        regex_grammar("a" * 5000)


def test_masks_touch_only_constrained_rows_and_exempt_ends_from_min_tokens(compiler):
    pick = compiler.compile(choice_grammar(["yes"]))
    model = tiny_model()
    vocab = model.config.vocab_size
    banned, ends_only = compute_masks([pick.matcher()], vocab)
    allowed = (~banned[0]).nonzero().flatten().tolist()
    assert allowed and all(model.tokenizer.decode([t]) in ("y", "ye", "yes") for t in allowed)
    logits = torch.randn(3, vocab)
    params = [SamplingParams(temperature=0.0)] * 3
    picked = sample_tokens(logits, params, [None] * 3, masks=TokenMasks((1,), banned))
    assert picked[1] in allowed
    assert picked[0] == int(logits[0].argmax()) and picked[2] == int(logits[2].argmax())
    eos = sorted(model.tokenizer.eos_token_ids)[0]
    only_eos = torch.ones(1, vocab, dtype=torch.bool)
    only_eos[0, eos] = False
    held = [SamplingParams(temperature=0.0, min_tokens=5)]
    assert sample_tokens(logits[:1], held, [None], eos_ids={eos},
                         masks=TokenMasks((0,), only_eos, frozenset({0}))) == [eos]


def test_the_mask_worker_thread_gives_the_masks_computed_inline(compiler):
    from radixgate.runtime.engine.grammar_masks import MaskFill, MaskWorker
    from radixgate.runtime.engine.sequence import Sequence
    pick = compiler.compile(choice_grammar(["alpha", "beta"]))
    vocab = tiny_model().config.vocab_size
    rows = [Sequence(Request([1], grammar=g), arrival=i)
            for i, g in enumerate((None, pick.matcher(), None, pick.matcher()))]
    banned, _ = compute_masks([pick.matcher()], vocab)
    for min_rows in (None, 2):                # one fill after another, batched
        worker = MaskWorker(vocab)
        worker.overlap = True                 # as on an accelerator / with a spare core
        worker.fill = MaskFill(min_rows)
        try:
            masks = worker.start(rows).result()
        finally:
            worker.close()
        assert masks.rows == (1, 3) and torch.equal(masks.banned[0], banned[0])
        assert torch.equal(masks.banned[1], banned[0])
    assert MaskWorker(vocab).start(rows[:1]) is None


def test_the_batched_fill_gives_the_masks_of_one_fill_after_another(compiler):
    """llguidance's batched fill (``MaskFill`` from ``min_rows`` rows) against the loop, for
    rows of different grammars in different states, an ended one included."""
    from radixgate.runtime.engine.grammar_masks import MaskFill
    vocab = tiny_model().config.vocab_size
    tokenizer = tiny_model().tokenizer
    sources = [json_grammar(SCHEMA), choice_grammar(["yes", "no"]), regex_grammar("[a-c]{3}")]
    prefixes = ['{"city": "Ro', "yes", "ab"]

    def rows():
        out = []
        for source, prefix in zip(sources, prefixes):
            for cut in (0, len(prefix)):
                grammar = compiler.compile(source).matcher()
                assert all(grammar.consume(t) for t in tokenizer.encode(prefix[:cut]))
                out.append(grammar)
        return out
    loop, ends = compute_masks(rows(), vocab, MaskFill(None))
    batched, batched_ends = compute_masks(rows(), vocab, MaskFill(2))
    assert torch.equal(loop, batched) and ends == batched_ends == [3]
    assert not torch.equal(loop[0], loop[1])


def test_the_batched_fill_is_used_only_where_two_cores_are_spare(monkeypatch):
    """On 2 cores it lost to one fill after another (benchmarks/RESULTS.md): a CPU forward
    on every core, or one core left, keeps the loop; an accelerator's host batches."""
    import os
    from radixgate.runtime.engine.grammar_masks import MaskFill, spare_mask_threads
    assert spare_mask_threads(2, 2, False) == 0 and spare_mask_threads(2, 1, False) == 1
    assert spare_mask_threads(2, 1, True) == 1 and spare_mask_threads(64, 1, True) == 16
    for cores, threads, accelerated, batched in ((2, 2, False, None), (2, 1, True, None),
                                                 (16, 16, False, None), (16, 4, False, 12),
                                                 (16, 16, True, 15)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)))
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
        fill = MaskFill.for_machine(accelerated)
        assert (fill.min_rows, fill.threads if batched else None) == (
            (2, batched) if batched else (None, None))


def test_a_grammar_whose_masks_cost_too_much_is_refused(compiler):
    with pytest.raises(GrammarError, match="too complex|too many"):
        compiler.compile(regex_grammar("((a{100}){100}){100}"))


class StallingClock:
    """``real`` plus a jump of ``stall_s`` at each of the next ``stalls`` even readings, so
    that ``stalls`` consecutive measured intervals (start, end) look slow."""

    def __init__(self, real, stalls: int, stall_s: float = 1.0):
        self.real, self.stalls, self.stall_s = real, stalls, stall_s
        self.readings, self.offset = 0, 0.0

    def __call__(self) -> float:
        self.readings += 1
        if self.readings % 2 == 0 and self.stalls > 0:
            self.stalls -= 1
            self.offset += self.stall_s
        return self.real() + self.offset


def stall_clocks(monkeypatch, stalls: int) -> None:
    """The next ``stalls`` measurements of both wall and thread CPU time look 1 s long."""
    import time
    for name in ("perf_counter", "thread_time"):
        monkeypatch.setattr(time, name, StallingClock(getattr(time, name), stalls))


def test_one_slow_mask_measurement_does_not_refuse_a_grammar(compiler, monkeypatch):
    """A mask that was slow once (the thread preempted, a cold cache) is measured again; a
    refusal needs every try to be slow."""
    from radixgate.gateway.constraints import GrammarCache
    cache = GrammarCache(compiler)
    source = json_grammar({**SCHEMA, "title": "slow once"})
    with monkeypatch.context() as patched:
        stall_clocks(patched, stalls=1)
        assert cache.get("acme", source).matcher() is not None


def test_a_wall_clock_stall_is_not_mask_cost(compiler, monkeypatch):
    """Only the probing thread's CPU time counts: a busy machine (wall time alone passing)
    does not make a grammar too complex."""
    import time
    with monkeypatch.context() as patched:
        patched.setattr(time, "perf_counter", StallingClock(time.perf_counter, stalls=100))
        compiler.compile(json_grammar({**SCHEMA, "title": "busy machine"}))


def test_a_too_complex_verdict_is_not_cached(compiler, monkeypatch):
    from radixgate.gateway.constraints import GrammarCache
    cache = GrammarCache(compiler)
    source = json_grammar({**SCHEMA, "title": "slow while measured"})
    with monkeypatch.context() as patched:
        stall_clocks(patched, stalls=100)
        with pytest.raises(GrammarError, match="too complex"):
            cache.get("acme", source)
    assert cache.get("acme", source).matcher() is not None and cache.compiles == 2
    with pytest.raises(GrammarError, match="strin"):        # grammar errors stay cached
        cache.get("acme", json_grammar({"type": "strin"}))
    with pytest.raises(GrammarError, match="strin"):
        cache.get("acme", json_grammar({"type": "strin"}))
    assert cache.compiles == 3
