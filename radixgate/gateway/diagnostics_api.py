"""GET /v1/cache/diagnostics/{request_id}: why a recent prompt of the caller's tenant missed
the cache (diagnostics.py builds the report). The id is the response's ``request-id``
(``req_...``) or the API's own id of the answer (``msg_...``, ``chatcmpl-...``); another
tenant's or an unknown id is a 404 (an admin key reads any tenant's)."""
from __future__ import annotations

from aiohttp import web

from radixgate.gateway.diagnostics import KEEP_PER_TENANT, KEEP_S
from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.http_util import principal_of, state_of


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/cache/diagnostics/{request_id}", diagnostics)


def request_id_from(wanted: str) -> str:
    """``req_X`` for ``req_X``, ``msg_X``, ``chatcmpl-X`` or ``cmpl-X``."""
    for prefix in ("req_", "msg_", "chatcmpl-", "cmpl-"):
        if wanted.startswith(prefix):
            return "req_" + wanted[len(prefix):]
    return wanted


async def diagnostics(request: web.Request) -> web.Response:
    principal, state = principal_of(request), state_of(request)
    wanted = request.match_info["request_id"]
    record = state.diagnostics.get(None if principal.is_admin else principal.tenant,
                                   request_id_from(wanted))
    if record is None:
        raise ApiError(Kind.NOT_FOUND, f"no recent request {wanted!r} of this tenant "
                       f"(diagnostics are kept {KEEP_S / 3600:g} h, {KEEP_PER_TENANT} a tenant)")
    return web.json_response(state.diagnostics.report(record))
