"""One ``EngineClient`` contract (radixgate/runtime/engine/client.py), run against both engines the
gateway can have: the in-process ``Engine`` and ``cluster.ClusterEngine`` over stand-in Ray
Serve handles whose two "replicas" are real tiny-model engines (no Ray cluster)."""
from __future__ import annotations

import asyncio
import gc

import pytest

from radixgate.cluster import registry
from radixgate.runtime.engine.api import (ErrorKind, Finished, FinishReason, Request,
                                          SamplingParams, TextDelta)
from radixgate.runtime.engine.client import EngineClient, RequestStream
from tests.support.engine import engine_config, tiny_model

pytest.importorskip("ray.exceptions")     # ClusterHandle tells a dead replica by Ray's errors

from radixgate.cluster import serve_app  # noqa: E402
from radixgate.cluster.client import ClusterEngine  # noqa: E402

REPLICAS = ("replica-a", "replica-b")
PROMPT = list(range(5, 75))               # 70 tokens: 4 full blocks of 16


class ReplicaStream:
    """``generate``'s stream on one stand-in replica: ``(replica, event)`` pairs; ``cancel``
    aborts the engine request (a Serve replica's generator aborts it as it closes)."""

    def __init__(self, name: str, engine, request: Request):
        self.name = name
        self.handle = engine.submit(request)

    def __aiter__(self):
        return self

    async def __anext__(self):
        return self.name, await self.handle.__anext__()

    def cancel(self):
        self.handle.abort()


class StandInHandle:
    """The deployment handle as ClusterEngine calls it: ``generate`` goes to the replicas
    in turn (``exclude`` honoured), ``call(..., target=)`` to the one named."""

    def __init__(self, engines: dict):
        self.engines = engines
        self.turn = 0
        self.call = _Commands(engines)

    def options(self, stream: bool = False):
        return self

    @property
    def generate(self):
        return self

    def remote(self, request: Request, ttl_s=None, exclude=()):
        names = [n for n in self.engines if n not in exclude] or list(self.engines)
        self.turn += 1
        name = names[self.turn % len(names)]
        return ReplicaStream(name, self.engines[name], request)


class _Commands:
    def __init__(self, engines: dict):
        self.engines = engines

    async def remote(self, command: str, *args, target: str):
        return target, await asyncio.wrap_future(getattr(self.engines[target], command)(*args))


class StandInRouter:
    """What ClusterEngine reads of the prefix router: the replicas and their reports."""

    def __init__(self, names):
        self.names = list(names)

    def replica_stats(self):
        return [{"replica": n, "pinned_tokens": {}, "pins_settled": []} for n in self.names]

    def replica_ids(self):
        return list(self.names)

    def request_done(self, replica, request_id):
        pass

    def take_placement(self, request_id):
        return None


@pytest.fixture(params=["engine", "cluster"])
def client(request, monkeypatch):
    from radixgate.runtime.engine.engine import Engine
    engines = {}

    def start(name):
        engines[name] = Engine(tiny_model(), engine_config(num_blocks=96)).start()
        return engines[name]

    if request.param == "engine":
        made = start("engine")
    else:
        router = StandInRouter(REPLICAS)
        registry.register(router)
        for name in REPLICAS:
            start(name)
        monkeypatch.setattr(serve_app, "stop_cluster", lambda started_ray: None)
        made = ClusterEngine(StandInHandle(engines), tiny_model().info, engine_config(),
                             started_ray=False)
    yield made
    made.shutdown(grace_s=0)
    for engine in engines.values():
        engine.shutdown(grace_s=0)
    if request.param == "cluster":
        del router
        gc.collect()                      # the registry holds routers weakly


def greedy(tokens, namespace="ns-acme", max_tokens=4, **fields) -> Request:
    return Request(list(tokens), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                ignore_eos=True),
                   tenant="acme", namespace=namespace, **fields)


async def events_of(stream) -> list:
    return await asyncio.wait_for(_collect(stream), timeout=120)


async def _collect(stream) -> list:
    return [event async for event in stream]


async def done(future):
    return await asyncio.wait_for(asyncio.wrap_future(future), timeout=120)


def test_it_is_an_engine_client_with_the_models_facts(client):
    assert isinstance(client, EngineClient)
    info = client.model_info
    assert info.tokenizer is client.tokenizer and info.name == "tiny-random-llama"
    assert info.vocab_size >= client.tokenizer.vocab_size
    assert client.max_model_len == info.max_model_len == 1024
    assert client.block_size == 16


async def test_a_request_streams_deltas_then_one_finished(client):
    stream = client.submit(greedy(PROMPT, max_tokens=6))
    assert isinstance(stream, RequestStream)
    events = await events_of(stream)
    *deltas, finished = events
    assert deltas and all(isinstance(e, TextDelta) for e in deltas)
    assert isinstance(finished, Finished) and finished.reason is FinishReason.LENGTH
    assert finished.text == "".join(d.text for d in deltas)
    assert finished.usage.prompt_tokens == len(PROMPT) and finished.usage.output_tokens == 6


async def test_a_refused_request_is_a_finished_error_not_an_exception(client):
    vocab = client.model_info.vocab_size
    (finished,) = await events_of(client.submit(greedy([1, 2, vocab + 5])))
    assert finished.reason is FinishReason.ERROR
    assert finished.error_kind is ErrorKind.BAD_REQUEST


async def test_abort_ends_a_running_request_with_aborted(client):
    stream = client.submit(greedy(PROMPT, max_tokens=500))
    first = await asyncio.wait_for(stream.__anext__(), timeout=120)
    assert isinstance(first, TextDelta)
    stream.abort()
    stream.abort()                                   # idempotent
    rest = await events_of(stream)
    assert isinstance(rest[-1], Finished) and rest[-1].reason is FinishReason.ABORTED
    assert rest[-1].usage.output_tokens < 500


async def test_publish_computes_into_the_namespace_it_is_given(client):
    published = await done(client.publish(PROMPT, 600.0, "ns-acme", "acme"))
    assert published.error_kind is None
    (_, *_, finished) = await events_of(client.submit(greedy(PROMPT + [80])))
    assert finished.usage.cache_read_tokens >= 64              # the published blocks
    (_, *_, other) = await events_of(client.submit(greedy(PROMPT + [80], "ns-other")))
    assert other.usage.cache_read_tokens == 0                  # only in that namespace
    public = await done(client.publish(PROMPT[:40], 600.0))    # default: public
    assert public.error_kind is None
    snapshot = await done(client.request_snapshot())
    assert {"ns-acme", "public"} <= {p.namespace for p in snapshot.pins}


async def test_pin_unpin_flush_and_integrity(client):
    await events_of(client.submit(greedy(PROMPT)))
    assert await done(client.pin("ns-acme", PROMPT[:64], 600.0, "acme")) == 64
    assert await done(client.unpin("ns-acme", PROMPT[:64]))
    await done(client.expect_continuation("ns-acme", PROMPT))
    assert await done(client.flush("ns-acme")) >= 4
    (_, *_, again) = await events_of(client.submit(greedy(PROMPT)))
    assert again.usage.cache_read_tokens == 0                  # flushed
    counts = await done(client.check_integrity())
    assert isinstance(counts, dict) and counts
    taken = await done(client.request_snapshot())
    assert taken.blocks.total >= 96
    assert client.snapshot().time >= taken.time              # the latest, never blocking
