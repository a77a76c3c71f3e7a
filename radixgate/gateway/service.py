"""One generation from a handler's point of view: build the engine Request, run it, book it.

``Generation`` is an async context manager around ``engine.submit``: leaving it early (a
client disconnect cancels the handler) aborts the request so its blocks are freed; every
finished request is recorded once in the usage book, the metrics and the access log.
"""
from __future__ import annotations

import asyncio
import functools
import time

from aiohttp import web

from radixgate.gateway.auth import Principal, namespace_for
from radixgate.gateway.errors import ApiError, Kind, from_engine
from radixgate.gateway.http_util import ACCESS
from radixgate.gateway.prepare import (check_length_bound, conversation_texts, render_bounded,
                                       room_for_prompt, run_abandonable)
from radixgate.gateway.render import (Conversation, RenderBudget, RenderedPrompt,
                                      render_continuation)
from radixgate.gateway.state import GatewayState
from radixgate.runtime.engine.stop import compile_stops, stop_problem
from radixgate.runtime.engine.api import (Breakpoint, Finished, FinishReason, Request, SamplingParams,
                                   TextDelta)

DEFAULT_MAX_TOKENS_CAP = 4096
_background: set[asyncio.Task] = set()
SEED_MODULUS = 1 << 63     # seeds are taken modulo this (torch generators take 64 bits)


def sampling_params(body, *, max_tokens: int, stop: list[str] | str | None,
                    logprobs: int | None = None,
                    prompt_logprobs: int | None = None) -> SamplingParams:
    """The engine's sampling values from a parsed request ``body`` (either API's model: a
    field the model lacks counts as omitted). Every field read here reaches the sampler."""
    if isinstance(stop, str):
        stop = [stop]
    field = functools.partial(getattr, body)
    top_k, seed = field("top_k", None), field("seed", None)
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_given(field("temperature", None), 1.0),
        top_p=_given(field("top_p", None), 1.0),
        top_k=0 if top_k is None or top_k < 0 else int(top_k),
        min_p=_given(field("min_p", None), 0.0),
        seed=None if seed is None else seed % SEED_MODULUS,
        stop=tuple(s for s in (stop or []) if s),
        ignore_eos=bool(field("ignore_eos", False)),
        min_tokens=int(field("min_tokens", None) or 0),
        presence_penalty=_given(field("presence_penalty", None), 0.0),
        frequency_penalty=_given(field("frequency_penalty", None), 0.0),
        repetition_penalty=_given(field("repetition_penalty", None), 1.0),
        logit_bias=logit_bias_pairs(field("logit_bias", None)), logprobs=logprobs,
        prompt_logprobs=prompt_logprobs, speculative=field("speculative", None))


def _given(value: float | None, default: float) -> float:
    return default if value is None else float(value)


def logit_bias_pairs(logit_bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` as (id, bias) pairs; a key that is not an integer is a
    400 (ids outside the vocabulary are refused by the engine's checks, also a 400)."""
    pairs = []
    for key, bias in (logit_bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise ApiError(Kind.BAD_REQUEST, f"logit_bias keys must be token ids, got {key!r}",
                           param="logit_bias") from None
        pairs.append((token, float(bias)))
    return tuple(pairs)


def reserved_for(state: GatewayState, asked: int | None) -> int:
    """Answer tokens the prompt must leave room for: all of ``asked`` with
    ``[server] strict_max_tokens``, else one (``max_tokens`` is then clamped to the room)."""
    return asked if asked and state.config.server.strict_max_tokens else 1


def answer_tokens(state: GatewayState, asked: int | None, prompt_len: int) -> int:
    """The engine's max_tokens: ``asked`` clamped to the room left in the context window
    (agent clients send 32,000 or more), or the default when the client gave none."""
    if asked is None:
        return default_max_tokens(state, prompt_len)
    if state.config.server.strict_max_tokens:
        return asked
    return max(1, min(asked, state.engine.max_model_len - prompt_len))


def default_max_tokens(state: GatewayState, prompt_len: int) -> int:
    """OpenAI without max_tokens: what is left of the context and of the KV pool, capped."""
    engine = state.engine
    room = min(engine.max_model_len, engine.num_blocks * engine.block_size) - prompt_len
    return max(1, min(room, DEFAULT_MAX_TOKENS_CAP))


async def render_request(state: GatewayState, principal: Principal, converted,
                         reserved: int) -> RenderedPrompt:
    """The request's prompt rendered within the context window (``reserved`` tokens kept
    for the answer) and ``request_timeout_s``; counts the template renders it cost."""
    engine = state.require_engine()
    room = room_for_prompt(engine.max_model_len, reserved)
    return await render_bounded(state.tokenizer, converted.conversation, room=room,
                                reserved=reserved, timeout_s=state.config.server.request_timeout_s,
                                on_template_render=state.metrics.template_renders.labels(
                                    principal.tenant).inc)


async def render_continuation_request(state: GatewayState, principal: Principal,
                                      conversation: Conversation, base: list[int],
                                      roles, reserved: int) -> RenderedPrompt:
    """A stored turn's exact ids ``base`` then ``conversation``'s new messages
    (``render.render_continuation``), within the context window like ``render_request``."""
    engine = state.require_engine()
    room = room_for_prompt(engine.max_model_len, reserved)
    check_length_bound(conversation_texts(conversation), state.tokenizer, room - len(base),
                       reserved)
    on_render = state.metrics.template_renders.labels(principal.tenant).inc
    return await run_abandonable(
        lambda cancelled: render_continuation(
            state.tokenizer, base, roles, conversation,
            RenderBudget(max_tokens=room, cancelled=cancelled, on_template_render=on_render)),
        timeout_s=state.config.server.request_timeout_s, room=room, reserved=reserved)


async def engine_request(state: GatewayState, principal: Principal, request_id: str,
                         tokens: list[int], breakpoints: tuple[Breakpoint, ...],
                         sampling: SamplingParams, cache_salt: str | None = None,
                         grammar=None, routing_hint: str | None = None) -> Request:
    """The engine Request: tenant and namespace come from the key, never from the body.
    Its stop strings are compiled here, in a worker thread (call it inside the tenant's
    preparing slot), so the engine thread never spends time on them. ``grammar``: a
    ``CompiledGrammar`` (radixgate/gateway/constraints.py) the output must match; the request gets its
    own state of it."""
    timeout = state.config.server.request_timeout_s
    automaton = None
    if sampling.stop and stop_problem(sampling.stop) is None:
        automaton = await asyncio.to_thread(compile_stops, sampling.stop)
    return Request(tokens=tokens, sampling=sampling, tenant=principal.tenant,
                   namespace=namespace_for(principal.tenant, cache_salt),
                   breakpoints=breakpoints, deadline=time.monotonic() + timeout,
                   use_public=principal.limits.use_public_prefixes, request_id=request_id,
                   stop_automaton=automaton,
                   grammar=grammar.matcher() if grammar is not None else None,
                   grammar_source=grammar.source if grammar is not None else "",
                   routing_hint=routing_hint or "")


class Generation:
    """``async with Generation(...) as gen: async for event in gen.events(): ...``"""

    def __init__(self, state: GatewayState, http: web.Request, principal: Principal,
                 api: str, request: Request):
        self.state = state
        self.http = http
        self.principal = principal
        self.api = api
        self.request = request
        self.finished: Finished | None = None
        self.diagnostics = None     # its prompt's diagnostics.Record (the first choice's)
        self._handle = None
        self._last_delta: float | None = None
        self.started = time.monotonic()

    async def __aenter__(self) -> "Generation":
        engine = self.state.require_engine()
        self._handle = engine.submit(self.request)
        self.http[ACCESS] = {"tenant": self.principal.tenant}
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self.finished is None:    # client gone (handler cancelled) or an early error
            self._handle.abort()
            task = asyncio.get_running_loop().create_task(self._book_after_abort())
            _background.add(task)                   # the loop keeps only weak references
            task.add_done_callback(_background.discard)

    async def _book_after_abort(self) -> None:
        """The aborted request's Finished still arrives: book it (outcome ``aborted``)."""
        async for event in self._handle:
            if isinstance(event, Finished):
                self.finished = event
                self._book(event)

    async def events(self):
        """TextDelta ... then the Finished event (booked before it is yielded)."""
        async for event in self._handle:
            if isinstance(event, TextDelta):
                self._observe_delta(event)
            elif isinstance(event, Finished):
                self.finished = event
                self._book(event)
            yield event

    async def first_event(self):
        """The first event; raises the mapped ApiError when the engine refused the request."""
        self._iterator = self.events()
        event = await self._iterator.__anext__()
        if isinstance(event, Finished):
            raise_if_error(event)
        return event

    async def rest(self):
        async for event in self._iterator:
            yield event

    async def result(self) -> Finished:
        """Runs to the end; raises ApiError when the request failed."""
        async for _ in self.events():
            pass
        raise_if_error(self.finished)
        return self.finished

    def expect_continuation(self) -> None:
        """The response is a tool call: the client will send the tool's result back with
        this conversation as its prefix, so the cache keeps it a while longer
        (``EvictionPolicy.continuation_ticks``). Fire and forget."""
        finished = self.finished
        if finished is None or finished.reason in (FinishReason.ERROR, FinishReason.ABORTED):
            return
        tokens = list(self.request.tokens) + list(finished.output_token_ids)
        if self.state.engine is not None:   # a stopped engine fails the future, never raises
            self.state.engine.expect_continuation(self.request.namespace, tokens)
            self.state.metrics.continuations.labels(self.principal.tenant).inc()

    def _observe_delta(self, event: TextDelta) -> None:
        now = time.monotonic()
        if self._last_delta is not None:
            self.state.metrics.observe_gap(self.principal.tenant, now - self._last_delta,
                                           len(event.token_ids))
        self._last_delta = now

    def _book(self, event: Finished) -> None:
        ok = event.reason is not FinishReason.ERROR
        usage = event.usage
        self.state.book.record(self.principal.tenant, usage, ok)
        if self.diagnostics is not None and ok:
            self.state.diagnostics.finish(self.diagnostics, usage)
        outcome = event.reason.value if ok else f"error_{event.error_kind.value if event.error_kind else 'unknown'}"
        self.state.metrics.observe_finished(self.principal.tenant, self.api, outcome, usage,
                                            time.monotonic() - self.started)
        self.http[ACCESS] = {
            "tenant": self.principal.tenant, "prompt": usage.prompt_tokens,
            "cached": usage.cache_read_tokens, "output": usage.output_tokens,
            "ttft_ms": None if usage.ttft_s is None else round(usage.ttft_s * 1000, 1),
            "finish": event.reason.value}


def finished_error(finished: Finished) -> ApiError | None:
    """The API error of a request that ended in an error or was aborted, else None."""
    if finished.reason is FinishReason.ERROR:
        return from_engine(finished.error_kind, finished.error_message, finished.request_id)
    if finished.reason is FinishReason.ABORTED:
        return ApiError(Kind.OVERLOADED, finished.error_message or
                        "the request was aborted (server shutting down)")
    return None


def raise_if_error(event: Finished) -> None:
    error = finished_error(event)
    if error is not None:
        raise error
