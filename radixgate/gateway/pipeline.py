"""The one handler pipeline: a request in an API's wire format -> running ``Generation``s.

Each API converts only its own format, into an ``Ask``; ``admit`` runs the same steps for
all of them, in the tenant's preparing slot (``streaming.admitted_body``):

1. the engine is required (503 while loading or draining);
2. the API's ``convert(state, principal, body) -> Ask``;
3. its constraint compiled (a 400 naming the parameter; ``structured.compile_constraint``);
4. room reserved for the answer (``service.reserved_for``);
5. the prompt: a conversation rendered within the context window, a stored turn continued
   token for token, or prompts the API tokenizes itself (legacy completions);
6. per prompt, its answer tokens and sampling values; per choice (``n``), its seed and the
   engine ``Request`` (tenant and namespace from the key, stop strings compiled);
7. one ``Generation`` per request, not yet submitted (the handler enters it).

``prompt_tokens`` renders a conversation alone (count_tokens, /tokenize).
"""
from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Sequence

from aiohttp import web

from radixgate.gateway import diagnostics
from radixgate.gateway.auth import Principal
from radixgate.gateway.http_util import request_id_of
from radixgate.gateway.prepare import ContextExceeded, room_for_prompt
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.render import RenderedPrompt
from radixgate.gateway.service import (SEED_MODULUS, Generation, answer_tokens, engine_request,
                                       render_continuation_request, render_request,
                                       reserved_for, sampling_params)
from radixgate.gateway.state import GatewayState
from radixgate.gateway.streaming import admitted_body
from radixgate.gateway.constraints import Constraint, compile_constraint
from radixgate.runtime.engine.api import Breakpoint, SamplingParams


@dataclass(frozen=True, slots=True)
class Continuation:
    """A stored turn's exact token ids (``base``) and template ``roles``; the new messages
    are the Ask's conversation."""

    base: list[int]
    roles: Sequence[str]


@dataclass(frozen=True)
class Ask:
    """One request as the pipeline runs it, after its API's own conversion.

    ``converted``: the conversation, its constraint and how to read the answer (None with
    ``tokenize``). ``tokenize(room, reserved)``: prompts the API turns into token lists
    itself, in a worker thread (each checked against ``room``). ``body``: the parsed
    request, whose sampling fields are read by ``service.sampling_params``. ``max_tokens``:
    as asked (None: the default). ``n``: choices per prompt. ``pin_prompt_s``: the whole
    prompt is pinned this long unless a breakpoint already ends there. ``note``: what the
    API keeps for its answer (the pipeline never reads it)."""

    api: str
    body: object
    converted: ConvertedPrompt | None = None
    constraint: Constraint | None = None
    continuation: Continuation | None = None
    tokenize: Callable[[int, int], list[list[int]]] | None = None
    max_tokens: int | None = None
    stop: list[str] | str | None = None
    n: int = 1
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    cache_salt: str | None = None
    routing_hint: str | None = None
    pin_prompt_s: float | None = None
    note: object = None


@dataclass
class Admitted:
    """What ``admit`` hands the handler: the body, its Ask, the prompts (one per prompt of a
    batch) and the generations (prompt by prompt, ``n`` choices each)."""

    state: GatewayState
    principal: Principal
    body: object
    ask: Ask
    prompts: list[RenderedPrompt] = field(default_factory=list)
    generations: list[Generation] = field(default_factory=list)

    @property
    def generation(self) -> Generation:
        return self.generations[0]


Convert = Callable[[GatewayState, Principal, object], Ask]


async def admit(request: web.Request, model: type, convert: Convert) -> Admitted:
    """Runs steps 1-7 for ``request`` (``model``: its pydantic body model)."""
    async with admitted_body(request, model) as (state, principal, body):
        state.require_engine()
        ask = convert(state, principal, body)
        constraint = ask.constraint or (ask.converted.constraint if ask.converted else None)
        grammar = await compile_constraint(state, principal.tenant, constraint)
        reserved = reserved_for(state, ask.max_tokens)
        try:
            prompts = await _prompts(state, principal, ask, reserved)
        except ContextExceeded as e:        # name the max_tokens the client sent
            raise e.naming(ask.max_tokens) from None
        admitted = Admitted(state, principal, body, ask, prompts)
        count = len(prompts) * ask.n
        for p, prompt in enumerate(prompts):
            sampling = sampling_params(
                body, max_tokens=answer_tokens(state, ask.max_tokens, len(prompt.tokens)),
                stop=ask.stop, logprobs=ask.logprobs, prompt_logprobs=ask.prompt_logprobs)
            for j in range(ask.n):
                engine_req = await engine_request(
                    state, principal, choice_id(request, p * ask.n + j, count), prompt.tokens,
                    _breakpoints(ask, prompt), choice_sampling(sampling, j), ask.cache_salt,
                    grammar, routing_hint=ask.routing_hint)
                generation = Generation(state, request, principal, ask.api, engine_req)
                if p == j == 0:                # the request's first prompt (diagnostics.py)
                    generation.diagnostics = _diagnostics(request, principal, ask, prompt,
                                                          engine_req, state)
                admitted.generations.append(generation)
    return admitted


def _diagnostics(request, principal, ask: Ask, prompt: RenderedPrompt, engine_req, state):
    """The request's diagnostics record, started now (finished by its Generation)."""
    record = diagnostics.new_record(request_id_of(request), principal.tenant, engine_req,
                                    ask.converted, prompt, ask.continuation is not None,
                                    diagnostics.opted_in(request), state.diagnostics.clock())
    state.diagnostics.start(record)
    return record


async def prompt_tokens(state: GatewayState, principal: Principal,
                        converted: ConvertedPrompt) -> list[int]:
    """A conversation's prompt token ids, rendered as a request renders it (no answer room)."""
    state.require_engine()
    return (await render_request(state, principal, converted, reserved=0)).tokens


async def _prompts(state, principal, ask: Ask, reserved: int) -> list[RenderedPrompt]:
    if ask.tokenize is not None:
        room = room_for_prompt(state.engine.max_model_len, reserved)
        lists = await asyncio.to_thread(ask.tokenize, room, reserved)
        return [RenderedPrompt(list(tokens), (), "") for tokens in lists]
    if ask.continuation is not None:
        return [await render_continuation_request(state, principal, ask.converted.conversation,
                                                  ask.continuation.base,
                                                  ask.continuation.roles, reserved)]
    return [await render_request(state, principal, ask.converted, reserved)]


def _breakpoints(ask: Ask, prompt: RenderedPrompt) -> tuple[Breakpoint, ...]:
    end = len(prompt.tokens)
    if ask.pin_prompt_s is None or any(b.offset == end for b in prompt.breakpoints):
        return prompt.breakpoints
    return prompt.breakpoints + (Breakpoint(end, ask.pin_prompt_s),)


def choice_id(request: web.Request, index: int, count: int) -> str:
    """The engine request id of choice ``index`` of ``count`` (the request's own when one)."""
    own = request_id_of(request)
    return own if count == 1 else f"{own}-{index}"


def choice_sampling(sampling: SamplingParams, index: int) -> SamplingParams:
    """Choice ``index``'s sampling: seeded choices use ``seed + index``, so they differ
    from each other and stay reproducible."""
    if index == 0 or sampling.seed is None:
        return sampling
    return dataclasses.replace(sampling, seed=(sampling.seed + index) % SEED_MODULUS)
