"""The gateway app in process (aiohttp ``TestServer``) over the shared tiny model, for tests
that need the engine itself: fault injection, and counters HTTP does not expose
(preemptions)."""
from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp.test_utils import TestServer

from radixgate.gateway.app import create_app
from radixgate.gateway.config import config_from_dict
from radixgate.gateway.http_util import STATE
from radixgate.gateway.state import engine_config
from radixgate.runtime.engine.engine import Engine
from tests.support.engine import tiny_model
from tests.support.server import ADMIN_KEY, tenant_key


@contextlib.asynccontextmanager
async def in_process_gateway(tenants=("acme", "beta", "gamma", "delta"), kv_cache_gb=0.002,
                             max_model_len=512, cache: dict | None = None, model=None,
                             server: dict | None = None, rpm: dict | None = None):
    """Yields (base_url, app) once the engine is ready; shuts it down on exit. ``cache``:
    more ``[cache]`` keys (a disk tier: ``"disk": {"dir": ..., "gb": ...}``); ``server``: more
    ``[server]`` keys (``state_dir``); ``rpm``: requests per minute by tenant (default
    unlimited); ``model``: a LoadedModel to serve (default: the shared tiny one)."""
    rpm = rpm or {}
    config = config_from_dict({
        "model": {"tiny": True, "max_model_len": max_model_len},
        "cache": {"kv_cache_gb": kv_cache_gb, **(cache or {})},
        "server": dict(server or {}),
        "admin": {"api_keys": [ADMIN_KEY]},
        "tenants": {t: {"api_keys": [tenant_key(t)], "requests_per_minute": rpm.get(t, 0),
                        "max_running": 64} for t in tenants}})
    app = create_app(config, lambda cfg: Engine(model or tiny_model(), engine_config(cfg)).start())
    async with TestServer(app, handler_cancellation=True) as server:
        deadline = time.monotonic() + 120
        while not app[STATE].ready:
            assert time.monotonic() < deadline, "in-process engine never became ready"
            await asyncio.sleep(0.05)
        yield str(server.make_url("")).rstrip("/"), app


def engine_of(app):
    return app[STATE].engine
