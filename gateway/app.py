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
import logging
import secrets
import time

from aiohttp import web

from radixgate.gateway import admin, anthropic_api, openai_api, openapi
from radixgate.gateway.auth import AuthError
from radixgate.gateway.config import GatewayConfig
from radixgate.gateway.errors import ApiError, Kind, api_for_path
from radixgate.gateway.http_util import ACCESS, PRINCIPAL, REQUEST_ID, STATE
from radixgate.gateway.state import EngineFactory, GatewayState

log = logging.getLogger("radixgate.gateway")
access_log = logging.getLogger("radixgate.access")

_AUTH_PREFIXES = ("/v1/",)
_AUTH_PATHS = ("/metrics",)


def create_app(config: GatewayConfig, engine_factory: EngineFactory | None = None
               ) -> web.Application:
    app = web.Application(middlewares=[gateway_middleware],
                          client_max_size=config.server.max_body_bytes)
    app[STATE] = GatewayState(config, engine_factory)
    anthropic_api.add_routes(app)
    openai_api.add_routes(app)
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


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    request_id = request.get(REQUEST_ID)
    if request_id is None:
        request_id = request[REQUEST_ID] = _new_request_id()
    response.headers["request-id"] = request_id


def _new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


@web.middleware
async def gateway_middleware(request: web.Request, handler) -> web.StreamResponse:
    request[REQUEST_ID] = _new_request_id()
    started = time.monotonic()
    status = 500
    try:
        _authenticate(request)
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


def _log_access(request: web.Request, status: int, seconds: float) -> None:
    info = request.get(ACCESS) or {}
    principal = request.get(PRINCIPAL)
    tenant = info.get("tenant") or (principal.tenant if principal else "-")
    access_log.info(
        "%s %s %s %d tenant=%s prompt=%s cached=%s output=%s ttft_ms=%s dur_ms=%.1f",
        request[REQUEST_ID], request.method, request.path, status, tenant,
        info.get("prompt", "-"), info.get("cached", "-"), info.get("output", "-"),
        info.get("ttft_ms", "-"), seconds * 1000)
