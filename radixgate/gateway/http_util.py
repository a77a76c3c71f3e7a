"""Request-side helpers shared by the route modules: typed app state, body parsing.

``parse_body`` turns any bad body (not JSON, NaN, lone surrogates, wrong types, missing
fields) into one ``ApiError(BAD_REQUEST)`` whose message names the field; the error
middleware renders it in the route's envelope. An oversized body raises aiohttp's 413
while reading, which the middleware maps too.
"""
from __future__ import annotations

import asyncio
import json
import re
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from radixgate.gateway.auth import Principal
from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.field_paths import UserError, user_errors
from radixgate.gateway.state import GatewayState

STATE = web.AppKey("radixgate_state", GatewayState)
_RequestKey = getattr(web, "RequestKey", None)     # aiohttp >= 3.12; plain strings before


def _request_key(name: str, kind: type):
    return _RequestKey(name, kind) if _RequestKey is not None else name


REQUEST_ID = _request_key("radixgate_request_id", str)
PRINCIPAL = _request_key("radixgate_principal", Principal)
ACCESS = _request_key("radixgate_access", dict)     # fields of the access-log line
CLIENT_REQUEST_ID = _request_key("radixgate_client_request_id", str)   # its x-request-id
IGNORED_FIELDS = _request_key("radixgate_ignored_fields", list)   # unknown body fields
M = TypeVar("M", bound=BaseModel)


def state_of(request: web.Request) -> GatewayState:
    return request.app[STATE]


def principal_of(request: web.Request) -> Principal:
    return request[PRINCIPAL]


def request_id_of(request: web.Request) -> str:
    return request[REQUEST_ID]


# a JSON escape of a UTF-16 surrogate: only such a body can hold a lone one (raw UTF-8 cannot);
# the check encodes the body again (a 2k-token prompt: 0.5 ms a request), so only those pay it
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_json(request: web.Request) -> object:
    raw = await read_body(request)
    if not raw:
        raise ApiError(Kind.BAD_REQUEST, "request body is empty; expected a JSON object")
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
        if _SURROGATE_ESCAPE.search(raw):                       # a \uD800-\uDFFF escape:
            json.dumps(data, ensure_ascii=False).encode("utf-8")   # a lone one fails here
    except UnicodeError:
        raise ApiError(Kind.BAD_REQUEST, "request body contains invalid Unicode") from None
    except RecursionError:
        raise ApiError(Kind.BAD_REQUEST, "request body is nested too deeply") from None
    except ValueError as e:
        raise ApiError(Kind.BAD_REQUEST, f"request body is not valid JSON: {e}") from None
    return data


async def read_body(request: web.Request) -> bytes:
    """The whole body within ``[server] body_timeout_s`` (a client that sends it slowly
    holds a connection and a tenant's preparing slot), else 408 (aiohttp then reads the
    rest for at most its 10 s lingering time before it closes the connection)."""
    limit = state_of(request).config.server.body_timeout_s
    try:
        async with asyncio.timeout(limit):
            return await request.read()
    except TimeoutError:
        raise ApiError(Kind.BODY_TIMEOUT, f"the request body did not arrive within {limit:g} "
                                          "seconds ([server] body_timeout_s)") from None


async def parse_body(request: web.Request, model: type[M]) -> M:
    """The body as ``model``; top-level fields the model does not know are ignored and
    named in the response's ``x-radixgate-ignored-fields`` header."""
    data = await read_json(request)
    if not isinstance(data, dict):
        raise ApiError(Kind.BAD_REQUEST, "request body must be a JSON object")
    known = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    ignored = sorted(set(data) - known)
    if ignored:
        request[IGNORED_FIELDS] = ignored
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = user_errors(e, model)
        raise ApiError(Kind.BAD_REQUEST, _message(errors),
                       param=(errors[0].path or None) if errors else None) from None


def validation_message(error: ValidationError, model: type[BaseModel] | None = None) -> str:
    """The first three errors, each at the client's field path (``field_paths``: pass the
    validated ``model`` so that pydantic's union and tag names are left out)."""
    return _message(user_errors(error, model))


def _message(errors: list[UserError]) -> str:
    parts = [f"{e.path or 'body'}: {e.message}" for e in errors[:3]]
    more = len(errors) - len(parts)
    return "; ".join(parts) + (f" (and {more} more errors)" if more > 0 else "")


def require_admin(request: web.Request) -> Principal:
    principal = principal_of(request)
    if not principal.is_admin:
        raise ApiError(Kind.PERMISSION, "this endpoint needs an admin API key")
    return principal
