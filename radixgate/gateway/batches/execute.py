"""One batch request through the steps of an interactive one (constraint, render, sampling,
engine request), without its HTTP request, at ``BATCH_PRIORITY``; booked like any request.

Its group (the requests sharing its system part: tools and system prompt) travels together:
the routing hint names the group (with ``--replicas`` a group goes to one replica), and once
a request has computed the system part it is pinned in the tenant's namespace (within the
tenant's pin share, never billed as cache creation) while requests of the group are running
(``GroupPins``): the last one to finish unpins it (``GROUP_PIN_S`` bounds it otherwise)."""
from __future__ import annotations

import asyncio
import hashlib

from radixgate.gateway.auth import ADMIN_TENANT, Principal
from radixgate.gateway.config import TenantConfig
from radixgate.gateway.constraints import compile_constraint
from radixgate.gateway.render import RenderedPrompt
from radixgate.gateway.service import (answer_tokens, engine_request, finished_error,
                                       render_request, reserved_for, sampling_params)
from radixgate.runtime.engine.api import BATCH_PRIORITY, Finished

GROUP_PIN_S = 120.0


class GroupPins:
    """The groups with requests running, and whether their system part is pinned yet."""

    def __init__(self):
        self.running: dict[tuple[str, str], int] = {}
        self.pinned: set[tuple[str, str]] = set()

    def enter(self, key: tuple[str, str]) -> None:
        self.running[key] = self.running.get(key, 0) + 1

    async def leave(self, state, key: tuple[str, str], tokens: list[int], tenant: str,
                    ok: bool) -> None:
        """One request of the group ended: pin its system part (computed now) while others
        run; the last one out unpins it."""
        self.running[key] -= 1
        engine = state.require_engine()
        if self.running[key] > 0:
            if ok and key not in self.pinned:
                self.pinned.add(key)
                await asyncio.wrap_future(engine.pin(key[0], tokens, GROUP_PIN_S, tenant))
            return
        del self.running[key]
        if key in self.pinned:
            self.pinned.discard(key)
            await asyncio.wrap_future(engine.unpin(key[0], tokens))


def principal_for(state, tenant: str, admin: bool) -> Principal:
    """Who a batch's requests run as (rebuilt after a restart from its tenant)."""
    config = state.keyring.tenants.get(tenant)
    if config is None:
        config = TenantConfig(name=tenant or ADMIN_TENANT, max_running=1 << 30,
                              max_pinned_tokens=1 << 60, requests_per_minute=0)
    return Principal(tenant, admin, config)


async def run_request(state, principal: Principal, request_id: str, converted, body, *,
                      max_tokens: int | None, stop, cache_salt: str | None,
                      pins: GroupPins | None = None, tokens: list[int] | None = None,
                      constraint=None) -> Finished:
    """``converted`` (the API's ConvertedPrompt) answered, or ``tokens`` (a prompt the API
    tokenized itself, with its ``constraint``); ApiError when it fails."""
    if converted is not None:
        constraint = converted.constraint
    grammar = await compile_constraint(state, principal.tenant, constraint)
    if converted is not None:
        prompt = await render_request(state, principal, converted,
                                      reserved_for(state, max_tokens))
    else:
        prompt = RenderedPrompt(list(tokens), (), "")
    sampling = sampling_params(body, max_tokens=answer_tokens(state, max_tokens,
                                                              len(prompt.tokens)), stop=stop)
    group = group_end(converted, prompt)
    hint = "batch:" + hashlib.blake2b(str(prompt.tokens[:group]).encode(),
                                      digest_size=8).hexdigest() if group else ""
    request = await engine_request(state, principal, request_id, prompt.tokens,
                                   prompt.breakpoints, sampling, cache_salt, grammar,
                                   routing_hint=hint)
    request.priority = BATCH_PRIORITY
    key = (request.namespace, hint)
    if group and pins is not None:
        pins.enter(key)
    finished = None
    try:
        async for event in state.require_engine().submit(request):
            if isinstance(event, Finished):
                finished = event
    finally:
        if group and pins is not None:
            ok = finished is not None and finished_error(finished) is None
            await pins.leave(state, key, prompt.tokens[:group], principal.tenant, ok)
    error = finished_error(finished)
    state.book.record(principal.tenant, finished.usage, error is None)
    if error is not None:
        raise error
    return finished


def group_end(converted, prompt) -> int:
    """Tokens of the prompt's system part (tools and system text: what a group shares);
    0 without one."""
    if converted is None:
        return 0
    pieces = len(converted.conversation.system)
    ends = prompt.segment_ends
    return ends[pieces - 1] if pieces and len(ends) >= pieces else 0
