"""A sequence's output side: new tokens -> finish checks -> text deltas -> the final event.

Token-level stops (EOS unless ``ignore_eos``, ``stop_token_ids``) end the request before the
token is detokenized: its text never appears. Stop strings are found in the detokenized text
(``StopMatcher``), which holds back any tail that could start one, so the text sent never
contains a stop string and ``Finished.text`` ends before it.

Within ``min_tokens`` nothing but the length ends the answer: the sampler holds EOS and stop
tokens back (one slipping through is an ordinary token here), and the text of those first
tokens bypasses the stop matcher: stop strings are looked for in the text from the
``min_tokens + 1``-th output token on (vLLM too checks them only past ``min_tokens``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .api import ErrorKind, Finished, FinishReason, TextDelta, Usage
from .sequence import Sequence

ONE_HOUR_S = 3600.0
ONE_DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class EndCause:
    """Why a sequence ends, inside the engine (a finish check's answer, an abort, an error);
    ``finished_event`` turns it into the request's last event, ``api.Finished``."""

    reason: FinishReason
    stop: str | None = None
    kind: ErrorKind | None = None
    message: str = ""


def account_admission(seq: Sequence) -> None:
    """Records prompt usage at the first admission (seq.num_computed is the reuse now):
    cache_read = reuse. Creation stays 0 until ``account_pins`` bills the pinned breakpoints,
    so a request that ends before its prompt is prefilled created nothing."""
    if seq.admitted_once:
        return
    seq.admitted_once = True
    seq.timing.first_scheduled = time.monotonic()
    seq.accounting.cache_read = seq.num_computed
    seq.accounting.cache_read_disk = min(seq.kv.disk_read, seq.num_computed)


def account_pins(seq: Sequence, pinned: list[tuple[int, float]],
                 outcomes: tuple[tuple[int, str], ...] = ()) -> None:
    """Bills cache creation for the breakpoints actually pinned (``pinned``: the pinned
    length and TTL of each); a breakpoint whose pin was skipped (tenant share or pin ceiling) is
    uncached input. Creation = prompt tokens in [reuse, last pinned breakpoint) computed now:
    the longest TTLs come first (the tokens up to the last pinned 24h one count as 24h, then
    up to the last pinned 1h one as 1h, the rest up to the last pinned one as 5m); the last
    prompt token is always recomputed and counts as uncached."""
    last = seq.num_prompt - 1

    def end_of(least_ttl_s: float) -> int:
        return min(max((end for end, ttl_s in pinned if ttl_s >= least_ttl_s), default=0), last)
    end_24h, end_1h, end_all = end_of(ONE_DAY_S), end_of(ONE_HOUR_S), end_of(0.0)
    acc = seq.accounting
    acc.pin_outcomes = outcomes
    reuse = acc.cache_read
    acc.creation_24h = max(0, end_24h - reuse)
    acc.creation_1h = max(0, end_1h - max(reuse, end_24h))
    acc.creation_5m = max(0, end_all - max(reuse, end_1h))


def append_token(seq: Sequence, token: int, eos_ids: set[int], max_model_len: int,
                 logprob=None) -> EndCause | None:
    """Adds a sampled token (with its ``TokenLogprob`` when the request asks for them),
    sends the text it completes, returns an EndCause when it ends seq."""
    seq.tokens.append(token)
    if seq.timing.first_token is None:
        seq.timing.first_token = time.monotonic()
    params = seq.params
    short = seq.num_output <= params.min_tokens   # this token is within min_tokens: no stop
    if not short and ((token in eos_ids and not params.ignore_eos)
                      or token in params.stop_token_ids):
        return EndCause(FinishReason.EOS)
    out = seq.output
    out.pending_ids.append(token)
    if logprob is not None:
        out.pending_logprobs.append(logprob)
    if short:
        emit_text(seq, out.detok.feed(token))
        return _length_finish(seq, max_model_len)
    result = out.stops.feed(out.detok.feed(token))
    emit_text(seq, result.emit)
    if result.stop is not None:
        return EndCause(FinishReason.STOP_SEQUENCE, stop=result.stop)
    return _length_finish(seq, max_model_len)


def _length_finish(seq: Sequence, max_model_len: int) -> EndCause | None:
    if seq.num_output >= seq.params.max_tokens or len(seq.tokens) >= max_model_len:
        return EndCause(FinishReason.LENGTH)
    return None


def emit_text(seq: Sequence, text: str) -> None:
    if text:
        out = seq.output
        usage = None if out.text_parts else usage_of(seq, time.monotonic())
        out.text_parts.append(text)
        logprobs = tuple(out.pending_logprobs)
        seq.sink.put(TextDelta(text, tuple(out.pending_ids), usage, logprobs))
        out.pending_ids.clear()
        out.pending_logprobs.clear()
        out.sent_logprobs.extend(logprobs)


def flush_text(seq: Sequence) -> None:
    """Sends held-back text at the end (nothing after a stop string)."""
    out = seq.output
    if out.stops.stopped is not None:
        return
    tail = out.stops.feed(out.detok.flush())
    emit_text(seq, tail.emit + out.stops.flush())


def usage_of(seq: Sequence, now: float) -> Usage:
    acc, timing = seq.accounting, seq.timing
    creation = acc.creation_5m + acc.creation_1h + acc.creation_24h
    started = timing.first_scheduled if timing.first_scheduled is not None else now
    return Usage(
        prompt_tokens=seq.num_prompt,
        cache_read_tokens=acc.cache_read,
        cache_creation_tokens=creation,
        cache_creation_5m_tokens=acc.creation_5m,
        cache_creation_1h_tokens=acc.creation_1h,
        cache_creation_24h_tokens=acc.creation_24h,
        cache_read_disk_tokens=acc.cache_read_disk, pin_outcomes=acc.pin_outcomes,
        uncached_tokens=seq.num_prompt - acc.cache_read - creation,
        output_tokens=seq.num_output,
        ttft_s=None if timing.first_token is None else timing.first_token - timing.submitted,
        queue_s=started - timing.submitted,
        total_s=now - timing.submitted,
    )


def finished_event(seq: Sequence, finish: EndCause) -> Finished:
    return Finished(
        reason=finish.reason,
        usage=usage_of(seq, time.monotonic()),
        output_token_ids=tuple(seq.output_ids),
        text="".join(seq.output.text_parts),
        stop_sequence=finish.stop,
        error_kind=finish.kind,
        error_message=finish.message,
        request_id=seq.request_id,
        logprobs=tuple(seq.output.sent_logprobs),
        prompt_logprobs=(tuple(seq.output.prompt_logprobs) if seq.params.prompt_logprobs is not None
                         else ()),
    )
