"""The engine's public contract: what the gateway, CLI, benchmarks and tests code against.

Pure Python (no torch), so the gateway can import it without touching tensors.
docs/ARCHITECTURE.md section 2 follows a request's path.

Submitting::

    handle = engine.submit(request)          # from inside a running asyncio loop
    async for event in handle:                # TextDelta ... then exactly one Finished
        ...
    handle.abort()                            # idempotent; a Finished(reason="aborted") follows

    finished = engine.generate(request)       # blocking helper for CLI, benchmarks and tests

Errors never raise out of ``submit``: a rejected request yields one ``Finished`` with
``reason="error"`` and an ``error_kind`` the gateway maps to an HTTP status.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

_request_counter = itertools.count(1)


class ErrorKind(str, enum.Enum):
    """Why a request failed; the gateway maps each to its API's status code."""

    BAD_REQUEST = "bad_request"      # 400: invalid sampling values, empty prompt ...
    TOO_LONG = "too_long"            # 400: prompt + max_tokens over the context window, or
                                     #      the request could never fit the KV budget
    OVER_CAPACITY = "over_capacity"  # 429: tenant quota (running/queued/pinned) exceeded
    OVERLOADED = "overloaded"        # 529 (Anthropic) / 503 (OpenAI): waiting queue full, draining
    TIMEOUT = "timeout"              # 504/408: deadline passed before completion
    INTERNAL = "internal"            # 500: a bug or an injected fault in a step


class EngineUnavailable(RuntimeError):
    """An engine did not answer a command in time (a replica of a scale-out deployment
    that is stuck or being replaced); the gateway answers 503 in the API's format."""


class FinishReason(str, enum.Enum):
    EOS = "eos"
    LENGTH = "length"
    STOP_SEQUENCE = "stop_sequence"
    ABORTED = "aborted"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """temperature below 1e-5 means greedy; every default below is off (radixgate/runtime/engine/sampling.py
    applies them, in its documented order). Penalties: ``presence_penalty`` and
    ``frequency_penalty`` in [-2, 2] count output tokens; ``repetition_penalty`` > 0 (1 is
    off) counts prompt and output tokens. ``logit_bias``: (token id, bias in [-100, 100])
    pairs. ``min_tokens``: EOS, stop tokens and stop strings do not end the answer before
    that many output tokens. ``min_p`` in [0, 1]: drop tokens below min_p x the top
    probability."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None      # report each output token's log probability and this
    # many most likely alternatives (0..20; None: off), from the model's own distribution
    prompt_logprobs: int | None = None   # the same for every prompt token after the first
    # (the whole prompt is then computed: no prefix reuse, since cached K/V has no logits)
    speculative: bool | None = None  # False: no drafts for this request (None: the server's
    # [spec] mode decides); drafts never change what is sampled (radixgate/runtime/engine/spec.py)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """An output token's log probability under the model's own distribution (log-softmax
    of its logits at temperature 1, before any sampling transform) and the ``top`` most
    likely tokens there, as (token id, log probability), most likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """Pin the prompt prefix ``tokens[:offset]`` for ``ttl_s`` seconds once it is cached."""

    offset: int
    ttl_s: float


BATCH_PRIORITY = 1      # Request.priority of batch work (Message Batches, OpenAI Batch)


@dataclass(slots=True)
class Request:
    """One generation request. ``namespace`` is derived by the gateway (docs/ARCHITECTURE.md section 4);
    the engine never derives or checks it. ``deadline`` is a ``time.monotonic()`` value."""

    tokens: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tenant: str = "default"
    namespace: str = "default"
    breakpoints: tuple[Breakpoint, ...] = ()
    deadline: float | None = None
    use_public: bool = False
    request_id: str = field(default_factory=lambda: f"req_{next(_request_counter):08d}")
    stop_automaton: object | None = None   # ``stop.compile_stops(sampling.stop)``, built by
    # the submitter off the engine thread (at the limits it takes ~60 ms); None: built lazily
    grammar: object | None = None   # ``grammar.RequestGrammar``: the output must match it
    # (this request's own state, from ``CompiledGrammar.matcher()``); None: unconstrained
    routing_hint: str = ""          # OpenAI's prompt_cache_key: requests sharing it go together
    # (scale-out routing only; the cache itself never reads it)
    grammar_source: str = ""        # that grammar's source, for an engine in another process
    # (a scale-out replica compiles its own state from it: the state does not pickle)
    priority: int = 0               # 0 interactive; BATCH_PRIORITY: admitted only while no
    # interactive request waits for room, prefilled after them, preempted first


@dataclass(frozen=True, slots=True)
class Usage:
    """Exact prompt accounting: cache_read + cache_creation + uncached == prompt_tokens.

    cache_read: prompt tokens served from the cache (reused, never recomputed).
    cache_creation: tokens computed now and pinned (up to the last breakpoint), split by TTL
    into creation_5m / creation_1h / creation_24h (a breakpoint with ttl_s >= 3600 counts as
    1h, one with ttl_s >= 86400 as 24h: OpenAI's ``prompt_cache_retention: "24h"`` with a
    disk tier).
    uncached: the rest, including the always-recomputed last prompt token.
    """

    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    cache_creation_5m_tokens: int = 0
    cache_creation_1h_tokens: int = 0
    cache_creation_24h_tokens: int = 0
    cache_read_disk_tokens: int = 0     # of cache_read, what was loaded from the disk tier
    # each prompt breakpoint: (offset, "pinned" | "pin_quota" | "pin_ceiling" | "no_cache")
    pin_outcomes: tuple[tuple[int, str], ...] = ()
    uncached_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    queue_s: float = 0.0
    total_s: float = 0.0

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cache_read_tokens


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New output text (UTF-8 safe; text that could begin a stop string is held back).

    The first delta of a request carries ``usage`` (prompt accounting is final once the
    prompt is prefilled; output counts so far) so a stream can report it up front."""

    text: str
    token_ids: tuple[int, ...] = ()
    usage: Usage | None = None
    logprobs: tuple[TokenLogprob, ...] = ()   # of token_ids, when the request asked for them


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of every request."""

    reason: FinishReason
    usage: Usage
    output_token_ids: tuple[int, ...] = ()
    text: str = ""                     # the whole output text (stop string excluded)
    stop_sequence: str | None = None   # which stop string matched
    error_kind: ErrorKind | None = None
    error_message: str = ""
    request_id: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()   # of every token whose text was sent
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()   # per prompt token, the first None


Event = TextDelta | Finished
