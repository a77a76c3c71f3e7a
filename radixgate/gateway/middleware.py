"""The gateway's one middleware and its response hook, around every route:

- every request gets an id (``request-id`` on every response, streams and aiohttp's own
  errors included; a client's short printable ``x-request-id`` is echoed and logged);
- /v1/*, /metrics and vLLM's /tokenize, /detokenize are authenticated (the principal is
  ``PRINCIPAL`` on the request); /v1/messages* checks an ``anthropic-version`` header;
- CORS: preflights answered without a key, allowed origins echoed
  (``[server] cors_allow_origins``);
- errors are rendered in the route's API envelope (never a bare 500);
- one access-log line per request (``radixgate.access``).
"""
from __future__ import annotations

import asyncio
import datetime
import logging
import re
import secrets
import time

from aiohttp import web

from radixgate.gateway.auth import AuthError
from radixgate.gateway.errors import ApiError, Kind, api_for_path
from radixgate.gateway.http_util import (ACCESS, CLIENT_REQUEST_ID, IGNORED_FIELDS, PRINCIPAL,
                                        REQUEST_ID, STATE)
from radixgate.gateway.vllm.utility import PATHS as VLLM_PATHS
from radixgate.runtime.engine.api import EngineUnavailable

log = logging.getLogger("radixgate.gateway")
access_log = logging.getLogger("radixgate.access")

_AUTH_PREFIXES = ("/v1/", "/v1beta/")
_AUTH_PATHS = ("/metrics", *VLLM_PATHS)
FIRST_ANTHROPIC_VERSION = "2023-01-01"   # the SDKs send dated versions (2.x: 2026-10-21)
_CORS_HEADERS = ("authorization, content-type, x-api-key, x-goog-api-key, anthropic-version, "
                 "x-request-id")
_CORS_EXPOSE = "request-id, x-request-id, retry-after"


def install(app: web.Application) -> None:
    """The middleware and the response hook that stamps ids and CORS headers."""
    app.middlewares.append(gateway_middleware)
    app.on_response_prepare.append(add_request_id)


async def add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    request_id = request.get(REQUEST_ID)
    if request_id is None:
        request_id = request[REQUEST_ID] = _new_request_id()
    response.headers["request-id"] = request_id
    client_id = request.get(CLIENT_REQUEST_ID)
    if client_id:
        response.headers["x-request-id"] = client_id
    ignored = request.get(IGNORED_FIELDS)
    if ignored:
        response.headers["x-radixgate-ignored-fields"] = _header_list(ignored)
    allowed = _cors_origin(request)
    if allowed:
        response.headers["Access-Control-Allow-Origin"] = allowed
        response.headers["Access-Control-Expose-Headers"] = _CORS_EXPOSE
        response.headers["Vary"] = "Origin"


_FIELD_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def _header_list(names: list[str]) -> str:
    """Field names safe for a header (others are counted, never echoed), at most 20."""
    plain = [n for n in names if _FIELD_NAME.fullmatch(n)]
    listed = plain[:20]
    others = len(names) - len(listed)
    return ", ".join(listed + ([f"({others} more)"] if others else []))


def _client_request_id(request: web.Request) -> str | None:
    """The client's ``x-request-id`` when it is short printable ASCII (echoed and logged)."""
    value = request.headers.get("x-request-id", "")
    if 0 < len(value) <= 128 and value.isascii() and value.isprintable():
        return value
    return None


def _cors_origin(request: web.Request) -> str | None:
    """The ``Access-Control-Allow-Origin`` value for this request, None when CORS is off or
    the origin is not allowed (``[server] cors_allow_origins``; ``"*"`` allows any)."""
    origin = request.headers.get("Origin")
    allowed = request.app[STATE].config.server.cors_allow_origins
    if not origin or not allowed:
        return None
    if origin in allowed or "*" in allowed:
        return origin
    return None


def _preflight(request: web.Request) -> web.Response:
    """A CORS preflight: answered without authentication (browsers send no key in it)."""
    if _cors_origin(request) is None:
        return web.Response(status=403, text="CORS origin not allowed")
    asked = request.headers.get("Access-Control-Request-Headers", "")
    return web.Response(status=204, headers={
        "Access-Control-Allow-Methods": "GET, POST, PATCH, DELETE, OPTIONS",
        "Access-Control-Allow-Headers": asked or _CORS_HEADERS,
        "Access-Control-Max-Age": "600"})


def _new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


@web.middleware
async def gateway_middleware(request: web.Request, handler) -> web.StreamResponse:
    request[REQUEST_ID] = _new_request_id()
    request[CLIENT_REQUEST_ID] = _client_request_id(request)
    started = time.monotonic()
    status = 500
    try:
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            response = _preflight(request)
            status = response.status
            return response
        _authenticate(request)
        _check_anthropic_version(request)
        response = await handler(request)
        status = response.status
        return response
    except ApiError as e:
        status = e.status(api_for_path(request.path))
        return _error_response(request, e)
    except web.HTTPException as e:
        if e.status < 400:
            status = e.status
            raise
        error = _http_error(request, e)
        status = error.status(api_for_path(request.path))
        return _error_response(request, error)
    except EngineUnavailable as e:
        error = ApiError(Kind.UNAVAILABLE, str(e))
        status = error.status(api_for_path(request.path))
        return _error_response(request, error)
    except (asyncio.CancelledError, ConnectionResetError):
        status = 499        # client closed the connection; the engine request was aborted
        raise
    except Exception:  # noqa: BLE001 - the client gets a clean 500 in its envelope
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error_response(request, ApiError(Kind.INTERNAL, "internal server error"))
    finally:
        _log_access(request, status, time.monotonic() - started)


def _authenticate(request: web.Request) -> None:
    path = request.path
    if not (path.startswith(_AUTH_PREFIXES) or path in _AUTH_PATHS):
        return
    try:
        query = request.query if path.startswith("/v1beta/") else None   # Gemini's ?key=
        request[PRINCIPAL] = request.app[STATE].keyring.authenticate(request.headers, query)
    except AuthError as e:
        raise ApiError(Kind.AUTHENTICATION, str(e)) from None


def _check_anthropic_version(request: web.Request) -> None:
    """On /v1/messages*, an ``anthropic-version`` header, when sent, must name a version of
    the Messages API (absent: the current one, so plain curl works)."""
    version = request.headers.get("anthropic-version")
    if version is None or not request.path.startswith("/v1/messages"):
        return
    if not _is_api_version(version):
        raise ApiError(Kind.BAD_REQUEST, f"anthropic-version: {version!r} is not a version of "
                       f"the Messages API (a date from {FIRST_ANTHROPIC_VERSION} on, such as "
                       "2023-06-01)")


def _is_api_version(version: str) -> bool:
    try:
        day = datetime.date.fromisoformat(version)
    except ValueError:
        return False
    return len(version) == 10 and day >= datetime.date.fromisoformat(FIRST_ANTHROPIC_VERSION)


def _http_error(request: web.Request, e: web.HTTPException) -> ApiError:
    if e.status == 413:
        limit = request.app[STATE].config.server.max_body_bytes
        return ApiError(Kind.TOO_LARGE, f"request body is too large: the limit is {limit} bytes")
    if e.status == 404:
        return ApiError(Kind.NOT_FOUND, f"no route for {request.method} {request.path}")
    if e.status == 405:
        return ApiError(Kind.METHOD, f"method {request.method} is not allowed for {request.path}")
    return ApiError(Kind.BAD_REQUEST, e.reason or f"HTTP {e.status}")


def _error_response(request: web.Request, error: ApiError) -> web.Response:
    api = api_for_path(request.path)
    return web.json_response(error.body(api, request.get(REQUEST_ID)),
                             status=error.status(api), headers=error.headers())


def _logged_id(request: web.Request) -> str:
    client_id = request.get(CLIENT_REQUEST_ID)
    own = request[REQUEST_ID]
    return f"{own} (client {client_id})" if client_id else own


def _log_access(request: web.Request, status: int, seconds: float) -> None:
    info = request.get(ACCESS) or {}
    principal = request.get(PRINCIPAL)
    tenant = info.get("tenant") or (principal.tenant if principal else "-")
    access_log.info(
        "%s %s %s %d tenant=%s prompt=%s cached=%s output=%s ttft_ms=%s dur_ms=%.1f",
        _logged_id(request), request.method, request.path, status, tenant,
        info.get("prompt", "-"), info.get("cached", "-"), info.get("output", "-"),
        info.get("ttft_ms", "-"), seconds * 1000)
