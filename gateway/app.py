"""The aiohttp application: ``create_app(config) -> web.Application``.

- state in ``web.AppKey`` (``STATE``); the engine is built in a worker thread by the
  ``cleanup_ctx`` (GET /health answers 503 until then) and shut down at cleanup;
- on shutdown (SIGTERM) the gateway stops admitting and drains the engine with
  ``server.shutdown_grace_s`` before connections are closed;
- one middleware gives every request an id (``request-id`` header on every response, also
  streams and aiohttp's own errors), authenticates /v1/* and /metrics, renders errors in the
  route's API envelope (never a bare 500) and writes one access-log line per request.

Serve it with ``handler_cancellation=True`` (``serve`` does) so a client that disconnects
cancels its handler, which aborts its engine request and frees its blocks.
"""
from __future__ import annotations

import asyncio
import datetime
import re
import logging
import secrets
import signal
import time

from aiohttp import web

from radixgate.gateway import (admin, anthropic_api, completions_api, openai_api, openapi,
                               responses_api, vllm_api)
from radixgate.gateway.auth import AuthError
from radixgate.gateway.config import GatewayConfig
from radixgate.gateway.errors import ApiError, Kind, api_for_path
from radixgate.gateway.http_util import (ACCESS, CLIENT_REQUEST_ID, IGNORED_FIELDS, PRINCIPAL,
                                        REQUEST_ID, STATE)
from radixgate.gateway.state import EngineFactory, GatewayState

log = logging.getLogger("radixgate.gateway")
access_log = logging.getLogger("radixgate.access")

_AUTH_PREFIXES = ("/v1/",)
FIRST_ANTHROPIC_VERSION = "2023-01-01"   # the SDKs send dated versions (2.x: 2026-10-21)
_CORS_HEADERS = "authorization, content-type, x-api-key, anthropic-version, x-request-id"
_CORS_EXPOSE = "request-id, x-request-id, retry-after"
DRAIN_FLUSH_S = 0.2
_drain_tasks: set[asyncio.Task] = set()     # the loop keeps only weak references
_AUTH_PATHS = ("/metrics", *vllm_api.PATHS)


def create_app(config: GatewayConfig, engine_factory: EngineFactory | None = None
               ) -> web.Application:
    app = web.Application(middlewares=[gateway_middleware],
                          client_max_size=config.server.max_body_bytes)
    app[STATE] = GatewayState(config, engine_factory)
    anthropic_api.add_routes(app)
    openai_api.add_routes(app)
    completions_api.add_routes(app)
    responses_api.add_routes(app)
    vllm_api.add_routes(app)
    admin.add_routes(app)
    openapi.add_routes(app)
    _add_dashboard(app)
    app.cleanup_ctx.append(_engine_ctx)
    app.on_shutdown.append(_drain)
    app.on_response_prepare.append(_add_request_id)
    return app


def _add_dashboard(app: web.Application) -> None:
    try:
        from radixgate.gateway.dashboard import add_dashboard_routes
    except ImportError:   # the dashboard module is optional for the API to work
        log.warning("dashboard module missing: /dashboard not served")
        return
    add_dashboard_routes(app)


async def _engine_ctx(app: web.Application):
    state = app[STATE]
    loading = asyncio.ensure_future(asyncio.to_thread(state.load))
    yield
    await loading          # a thread cannot be cancelled: wait for the load to end
    await asyncio.to_thread(state.shutdown, 0.0)


async def _drain(app: web.Application) -> None:
    """SIGTERM: refuse new requests, let running ones finish within the grace period."""
    state = app[STATE]
    state.draining = True
    if state.ready:
        log.info("draining: up to %.1f s for running requests", state.config.server.shutdown_grace_s)
        await asyncio.to_thread(state.shutdown, state.config.server.shutdown_grace_s)


def install_drain_signals(app: web.Application) -> None:
    """For ``serve`` (run_app with ``handle_signals=False``): SIGTERM/SIGINT start a drain
    while the listener stays open, so new requests get 503 with ``retry-after`` instead of a
    refused connection; running ones get ``shutdown_grace_s``; then the server exits. A
    second signal exits at once."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _begin_drain, app)


def _begin_drain(app: web.Application) -> None:
    state = app[STATE]
    if state.draining:
        raise web.GracefulExit()
    state.draining = True
    _drain_tasks.add(asyncio.get_running_loop().create_task(_drain_then_exit(app)))


async def _drain_then_exit(app: web.Application) -> None:
    await _drain(app)
    await asyncio.sleep(DRAIN_FLUSH_S)        # let the last answers reach their clients
    asyncio.get_running_loop().call_soon(_exit)


def _exit() -> None:
    raise web.GracefulExit()


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
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
        "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
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
        request[PRINCIPAL] = request.app[STATE].keyring.authenticate(request.headers)
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
