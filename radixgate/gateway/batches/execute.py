"""One batch request through the steps of an interactive one (constraint, render, sampling,
engine request), without its HTTP request, at ``BATCH_PRIORITY``; booked like any request."""
from __future__ import annotations

from radixgate.gateway.auth import ADMIN_TENANT, Principal
from radixgate.gateway.config import TenantConfig
from radixgate.gateway.constraints import compile_constraint
from radixgate.gateway.service import (answer_tokens, engine_request, finished_error,
                                       render_request, reserved_for, sampling_params)
from radixgate.runtime.engine.api import BATCH_PRIORITY, Finished


def principal_for(state, tenant: str, admin: bool) -> Principal:
    """Who a batch's requests run as (rebuilt after a restart from its tenant)."""
    config = state.keyring.tenants.get(tenant)
    if config is None:
        config = TenantConfig(name=tenant or ADMIN_TENANT, max_running=1 << 30,
                              max_pinned_tokens=1 << 60, requests_per_minute=0)
    return Principal(tenant, admin, config)


async def run_request(state, principal: Principal, request_id: str, converted, body, *,
                      max_tokens: int | None, stop, cache_salt: str | None) -> Finished:
    """``converted`` (the API's ConvertedPrompt) answered; ApiError when it fails."""
    grammar = await compile_constraint(state, principal.tenant, converted.constraint)
    prompt = await render_request(state, principal, converted, reserved_for(state, max_tokens))
    sampling = sampling_params(body, max_tokens=answer_tokens(state, max_tokens,
                                                              len(prompt.tokens)), stop=stop)
    request = await engine_request(state, principal, request_id, prompt.tokens,
                                   prompt.breakpoints, sampling, cache_salt, grammar)
    request.priority = BATCH_PRIORITY
    finished = None
    async for event in state.require_engine().submit(request):
        if isinstance(event, Finished):
            finished = event
    error = finished_error(finished)
    state.book.record(principal.tenant, finished.usage, error is None)
    if error is not None:
        raise error
    return finished
