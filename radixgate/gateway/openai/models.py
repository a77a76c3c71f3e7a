"""GET /v1/models and /v1/models/{id}: the served model, in OpenAI's shape, or
Anthropic's when the client sends ``anthropic-version`` (both SDKs list models here)."""
from __future__ import annotations

import time

from aiohttp import web

from radixgate.gateway.http_util import state_of


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id}", get_model)


def _model_entry(state, anthropic: bool) -> dict:
    created = int(time.time() - state.book.uptime_s())
    if anthropic:
        return {"type": "model", "id": state.model_name, "display_name": state.model_name,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))}
    return {"id": state.model_name, "object": "model", "created": created,
            "owned_by": "radixgate", "max_model_len": state.config.model.max_model_len,
            "aliases": list(state.config.model.aliases)}


async def list_models(request: web.Request) -> web.Response:
    """OpenAI shape; Anthropic's when the client sends ``anthropic-version``."""
    state = state_of(request)
    if "anthropic-version" in request.headers:
        entry = _model_entry(state, True)
        return web.json_response({"data": [entry], "has_more": False,
                                  "first_id": entry["id"], "last_id": entry["id"]})
    return web.json_response({"object": "list", "data": [_model_entry(state, False)]})


async def get_model(request: web.Request) -> web.Response:
    state = state_of(request)
    state.resolve_model(request.match_info["model_id"])
    return web.json_response(_model_entry(state, "anthropic-version" in request.headers))
