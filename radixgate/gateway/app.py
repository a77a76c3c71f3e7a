"""The aiohttp application: ``create_app(config) -> web.Application``.

- state in ``web.AppKey`` (``STATE``); the engine is built in a worker thread by the
  ``cleanup_ctx`` (GET /health answers 503 until then) and shut down at cleanup;
- the routes: each API's package (anthropic/, openai/, openai/responses/, vllm/), the
  operations routes (admin.py), /openapi.json and the dashboard;
- the middleware (radixgate/gateway/middleware.py): request ids, authentication, CORS, errors in the
  route's envelope, the access log;
- on shutdown (SIGTERM) the gateway stops admitting and drains the engine with
  ``server.shutdown_grace_s`` before connections are closed.

Serve it with ``handler_cancellation=True`` (``serve`` does) so a client that disconnects
cancels its handler, which aborts its engine request and frees its blocks.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import weakref

from aiohttp import web

from radixgate.gateway import admin, cache_usage, diagnostics_api, middleware, openapi
from radixgate.gateway.anthropic import messages
from radixgate.gateway.batches import setup as batches
from radixgate.gateway.config import GatewayConfig
from radixgate.gateway.gemini import api as gemini
from radixgate.gateway.gemini import caches as gemini_caches
from radixgate.gateway.http_util import STATE
from radixgate.gateway.openai import chat, completions, models
from radixgate.gateway.openai.responses import api as responses
from radixgate.gateway.state import EngineFactory, GatewayState
from radixgate.gateway.vllm import utility as vllm_utility

log = logging.getLogger("radixgate.gateway")
DRAIN_FLUSH_S = 0.2
_drain_tasks: set[asyncio.Task] = set()     # the loop keeps only weak references
_drains: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # state -> its one drain
ROUTES = (messages, batches, chat, completions, models, responses, gemini, gemini_caches,
          vllm_utility, admin, cache_usage, diagnostics_api, openapi)


def create_app(config: GatewayConfig, engine_factory: EngineFactory | None = None
               ) -> web.Application:
    app = web.Application(client_max_size=config.server.max_body_bytes)
    middleware.install(app)
    app[STATE] = GatewayState(config, engine_factory)
    for module in ROUTES:
        module.add_routes(app)
    _add_dashboard(app)
    app.cleanup_ctx.append(_engine_ctx)
    app.on_shutdown.append(_drain)
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
    """SIGTERM: refuse new requests, let running ones finish within the grace period.
    Once per server: the signal's drain and the shutdown hook after it share one task."""
    state = app[STATE]
    state.draining = True
    if state not in _drains:
        _drains[state] = asyncio.ensure_future(_drain_engine(state))
    await asyncio.shield(_drains[state])


async def _drain_engine(state: GatewayState) -> None:
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


