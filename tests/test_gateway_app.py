"""The app in-process (pytest-aiohttp) with a real tiny engine: loading state, per-tenant
rate limit (429 + retry-after), full queue (Anthropic 529 / OpenAI 503), body size limit."""
from __future__ import annotations

import asyncio
import functools
import threading

import pytest

from radixgate.gateway.app import create_app
from radixgate.gateway.config import config_from_dict
from radixgate.gateway.state import engine_config

RAW = {
    "server": {"max_queue": 1, "max_body_bytes": 4096},
    "model": {"max_model_len": 512, "tiny": True},
    "cache": {"kv_cache_gb": 0.002},
    "admin": {"api_keys": ["sk-admin"]},
    "tenants": {"slow": {"api_keys": ["sk-slow"], "requests_per_minute": 2},
                "solo": {"api_keys": ["sk-solo"], "max_running": 1}},
}


@functools.cache
def tiny_model():
    from radixgate.runtime.model.loader import load_model
    return load_model("default", tiny=True, max_model_len=512)


def engine_factory(config, gate: threading.Event | None = None):
    from radixgate.runtime.engine.engine import Engine
    if gate is not None:
        gate.wait(30)
    return Engine(tiny_model(), engine_config(config)).start()


async def start(aiohttp_client, factory=engine_factory):
    app = create_app(config_from_dict(RAW), engine_factory=factory)
    client = await aiohttp_client(app, server_kwargs={"handler_cancellation": True})
    return client


async def wait_ready(client, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if (await client.get("/health")).status == 200:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("engine never became ready")


def message(max_tokens: int = 2, stream: bool = False) -> dict:
    return {"model": "claude-3-x", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": "hello"}]}


async def test_health_is_503_while_the_model_loads(aiohttp_client):
    gate = threading.Event()
    client = await start(aiohttp_client, functools.partial(engine_factory, gate=gate))
    health = await client.get("/health")
    assert health.status == 503 and (await health.json())["status"] == "loading"
    busy = await client.post("/v1/messages", json=message(), headers={"x-api-key": "sk-solo"})
    assert busy.status == 503 and (await busy.json())["type"] == "error"
    gate.set()
    await wait_ready(client)
    ok = await client.post("/v1/messages", json=message(), headers={"x-api-key": "sk-solo"})
    assert ok.status == 200


async def test_tenant_over_its_rate_gets_429_with_retry_after(aiohttp_client):
    client = await start(aiohttp_client)
    await wait_ready(client)
    for _ in range(2):
        ok = await client.post("/v1/messages", json=message(), headers={"x-api-key": "sk-slow"})
        assert ok.status == 200
    limited = await client.post("/v1/messages", json=message(), headers={"x-api-key": "sk-slow"})
    assert limited.status == 429
    assert int(limited.headers["retry-after"]) >= 1
    assert (await limited.json())["error"]["type"] == "rate_limit_error"
    chat = {"model": "gpt-4o", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    limited = await client.post("/v1/chat/completions", json=chat, headers={"x-api-key": "sk-slow"})
    assert limited.status == 429 and (await limited.json())["error"]["code"] == "rate_limit_exceeded"
    other = await client.post("/v1/messages", json=message(), headers={"x-api-key": "sk-solo"})
    assert other.status == 200                       # other tenants are not limited


async def test_full_queue_is_overloaded_529_and_503(aiohttp_client):
    client = await start(aiohttp_client)
    await wait_ready(client)
    solo = {"x-api-key": "sk-solo"}
    running = await client.post("/v1/messages", json=message(300, stream=True), headers=solo)
    assert running.status == 200                     # solo's one running slot
    await running.content.readline()
    waiting = asyncio.ensure_future(client.post("/v1/messages", json=message(2), headers=solo))
    for _ in range(200):                             # until the second one waits in the queue
        stats = await (await client.get("/v1/cache/stats", headers={"x-api-key": "sk-admin"})).json()
        if stats["requests"]["waiting"] == 1:
            break
        await asyncio.sleep(0.05)
    assert stats["requests"]["waiting"] == 1
    over = await client.post("/v1/messages", json=message(), headers=solo)
    assert over.status == 529 and (await over.json())["error"]["type"] == "overloaded_error"
    assert over.headers["retry-after"] == "1"
    chat = {"model": "gpt-4o", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    over = await client.post("/v1/chat/completions", json=chat, headers=solo)
    assert over.status == 503 and (await over.json())["error"]["code"] == "overloaded"
    running.close()                                  # disconnect: frees the running slot
    assert (await waiting).status == 200


async def test_body_over_the_configured_limit_is_413(aiohttp_client):
    client = await start(aiohttp_client)
    await wait_ready(client)
    body = message()
    body["messages"][0]["content"] = "x" * 5000
    response = await client.post("/v1/messages", json=body, headers={"x-api-key": "sk-solo"})
    assert response.status == 413
    assert (await response.json())["error"]["type"] == "request_too_large"


async def test_error_after_the_200_is_sent_as_an_error_event(aiohttp_client):
    from radixgate.gateway.http_util import STATE
    client = await start(aiohttp_client)
    await wait_ready(client)
    engine = client.app[STATE].engine
    headers = {"x-api-key": "sk-solo"}
    response = await client.post("/v1/messages", json=message(200, stream=True), headers=headers)
    assert response.status == 200
    await asyncio.wrap_future(engine.inject_fault(response.headers["request-id"]))
    text = (await response.read()).decode()
    events = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event:")]
    assert events[0] == "message_start" and events[-1] == "error"
    assert "message_stop" not in events
    assert '"type": "api_error"' in text.split("event: error", 1)[1]
    chat = {"model": "gpt-4o", "max_tokens": 200, "stream": True,
            "messages": [{"role": "user", "content": "x"}]}
    response = await client.post("/v1/chat/completions", json=chat, headers=headers)
    await asyncio.wrap_future(engine.inject_fault(response.headers["request-id"]))
    lines = [l for l in (await response.read()).decode().splitlines() if l.startswith("data:")]
    assert '"error"' in lines[-2] and lines[-1] == "data: [DONE]"
    report = await asyncio.wrap_future(engine.check_integrity())
    assert report["running"] == 0 and report["locks"] == 0


async def test_an_engine_that_does_not_answer_a_command_is_a_503_in_the_apis_format(aiohttp_client):
    """A scale-out replica that does not answer a flush in time (``EngineUnavailable``)
    gives the admin a 503 in the API's own envelope, not a generic 500."""
    from concurrent.futures import Future

    from radixgate.runtime.engine.api import EngineUnavailable

    class Silent:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def flush(self, namespace=None):
            future = Future()
            future.set_exception(EngineUnavailable("engine replica(s) r-1 did not answer 'flush'"))
            return future

    client = await start(aiohttp_client, lambda config: Silent(engine_factory(config)))
    await wait_ready(client)
    resp = await client.post("/v1/cache/flush", headers={"authorization": "Bearer sk-admin"})
    body = await resp.json()
    assert resp.status == 503, body
    assert "r-1 did not answer" in body["error"]["message"]
