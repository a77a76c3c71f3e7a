"""The batch APIs wired into the app: one store and one runner per gateway (the state
folder's ``batches/``), the runner started with the app and stopped at its cleanup."""
from __future__ import annotations

from aiohttp import web

from radixgate.gateway.batches import anthropic_api, openai_api
from radixgate.gateway.batches.anthropic_api import BATCHES
from radixgate.gateway.batches.execute import GroupPins
from radixgate.gateway.batches.runner import BatchRunner
from radixgate.gateway.batches.store import BatchStore
from radixgate.gateway.http_util import STATE
from radixgate.gateway.state_dir import state_folder


def add_routes(app: web.Application) -> None:
    state = app[STATE]
    store = BatchStore(state_folder(state.config))
    pins = GroupPins()                  # one registry: a tenant's groups across both APIs
    runner = BatchRunner(store, {"anthropic": anthropic_api.anthropic_api(state, pins),
                                 "openai": openai_api.openai_api(state, pins)},
                         ready=lambda: state.ready and not state.draining)
    app[BATCHES] = {"store": store, "runner": runner}
    anthropic_api.add_routes(app)
    openai_api.add_routes(app)

    async def start(app: web.Application) -> None:
        runner.start()

    async def stop(app: web.Application) -> None:
        await runner.stop()

    app.on_startup.append(start)
    app.on_shutdown.append(stop)
