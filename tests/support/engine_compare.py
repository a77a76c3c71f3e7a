"""Helpers for the engine tests: hold the engine thread, run requests, compare greedy runs
under the near-tie rule of docs/ARCHITECTURE.md section 7, check integrity after a scenario."""
from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from radixgate.runtime.engine.api import FinishReason, Finished, Request, SamplingParams
from radixgate.runtime.engine.engine import Engine
from tests.support.finished import COMPLETED, assert_finished

NEAR_TIE = 1e-3
# requests generate_all keeps in flight: below the engine's 256-place queue (a request
# over it is refused at once, and its empty output would count as an answer)
IN_FLIGHT = 128


@contextlib.contextmanager
def held(engine: Engine):
    """Blocks the engine thread inside a command: everything submitted meanwhile is applied
    together before the next step (so several requests wait at once)."""
    gate, entered = threading.Event(), threading.Event()
    engine._command(lambda: (entered.set(), gate.wait(60)))
    assert entered.wait(60), "the engine thread did not pick up the gate command"
    try:
        yield
    finally:
        gate.set()


def greedy(tokens, max_tokens: int = 8, **request_fields) -> Request:
    return Request(list(tokens), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                ignore_eos=True), **request_fields)


def generate_all(engine: Engine, requests: list[Request], timeout: float = 300,
                 expect: tuple[FinishReason, ...] = COMPLETED) -> list[Finished]:
    """Runs requests concurrently (one blocking generate per thread, at most ``IN_FLIGHT``
    at once) and returns in order, each checked to have finished for one of ``expect``
    (by default: it completed, no error or abort)."""
    with ThreadPoolExecutor(max_workers=min(len(requests), IN_FLIGHT)) as pool:
        finished = list(pool.map(lambda r: engine.generate(r, timeout=timeout), requests))
    return assert_finished(finished, *expect)


def assert_clean(engine: Engine) -> dict:
    """Integrity after a scenario: tree/pool recount, free + held == total, nothing locked."""
    counts = engine.check_integrity().result(timeout=60)
    assert counts["running"] == 0 and counts["locks"] == 0, counts
    assert counts["free"] + counts["held"] == counts["total"], counts
    return counts


@dataclass
class Comparison:
    full_match: bool      # every token equal (no near tie cut the comparison short)
    compared: int         # tokens compared before a near tie (or all)
    max_logit_diff: float


def compare_greedy(engine: Engine, got: Finished, reference_engine: Engine, ref: Finished,
                   logit_tol: float, exact: bool = False) -> Comparison:
    """Tokens must agree up to the first step whose reference top-2 gap is below NEAR_TIE;
    logits must agree within logit_tol up to there (both engines record_logits=True).
    ``exact`` (both engines deterministic, docs/ARCHITECTURE.md section 5c): no near-tie
    rule, every step's logits the same bits and every token equal."""
    mine, theirs = engine.debug_trace(got.request_id), reference_engine.debug_trace(ref.request_id)
    assert mine is not None and theirs is not None, "engines need record_logits=True"
    if exact:
        assert got.output_token_ids == ref.output_token_ids
        for step in range(len(ref.output_token_ids)):
            assert torch.equal(mine.logits[step], theirs.logits[step]), \
                f"step {step}: logits differ by {(mine.logits[step] - theirs.logits[step]).abs().max()}"
        return Comparison(True, len(ref.output_token_ids), 0.0)
    worst = 0.0
    for step, (a, b) in enumerate(zip(got.output_token_ids, ref.output_token_ids)):
        diff = float((mine.logits[step] - theirs.logits[step]).abs().max())
        worst = max(worst, diff)
        assert diff < logit_tol, f"step {step}: logits differ by {diff} (tolerance {logit_tol})"
        if theirs.gaps[step] < NEAR_TIE or mine.gaps[step] < NEAR_TIE:
            return Comparison(False, step, worst)
        assert a == b, f"step {step}: token {a} != reference {b} (gap {theirs.gaps[step]:.4f})"
    assert len(got.output_token_ids) == len(ref.output_token_ids)
    return Comparison(True, len(ref.output_token_ids), worst)

