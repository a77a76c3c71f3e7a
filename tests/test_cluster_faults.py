"""The gateway side of a dying replica, with a stand-in deployment handle: a request
whose replica dies before its first event goes to another try, on another replica; one
that had started streaming ends with a clean internal error; quotas are released either
way."""
from __future__ import annotations

import pytest

from radixgate.runtime.engine.api import ErrorKind, Finished, FinishReason, Request, TextDelta, Usage
from radixgate.runtime.engine.engine_config import EngineConfig, TenantQuota
from radixgate.runtime.model.model_info import ModelInfo

rex = pytest.importorskip("ray.exceptions")

from radixgate.cluster import client as cluster_client  # noqa: E402
from radixgate.cluster import registry  # noqa: E402


class Stream:
    """A streaming response: ``events`` then, if ``die``, an actor death."""

    def __init__(self, events, die: bool):
        self.events, self.die, self.cancelled = list(events), die, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.events:
            return self.events.pop(0)
        if self.die:
            raise rex.ActorDiedError()
        raise StopAsyncIteration

    def cancel(self):
        self.cancelled = True


class Handle:
    """Each call takes the next scripted stream."""

    def __init__(self, streams):
        self.streams = list(streams)
        self.calls = 0

    def options(self, **_):
        return self

    @property
    def generate(self):
        return self

    def remote(self, request, ttl, exclude=()):
        self.calls += 1
        return self.streams.pop(0)


class Router:
    """What the client reads of the prefix router: where each try went."""

    def __init__(self):
        self.placements: dict[str, str] = {}

    def take_placement(self, request_id: str):
        return self.placements.pop(request_id, None)

    def request_done(self, replica: str, request_id: str) -> None:
        pass


class RoutingHandle(Handle):
    """Routes like the router: each try to the first of ``replicas`` that the call does
    not exclude (all excluded: the first); a replica in ``dying`` dies before answering."""

    def __init__(self, replicas: list[str], dying: set[str], router: Router):
        super().__init__([])
        self.replicas, self.dying, self.router = replicas, dying, router
        self.tries: list[str] = []

    def remote(self, request, ttl, exclude=()):
        self.calls += 1
        replica = ([r for r in self.replicas if r not in exclude] or self.replicas)[0]
        self.router.placements[request.request_id] = replica
        self.tries.append(replica)
        if replica in self.dying:
            return Stream([], die=True)
        return Stream([(replica, finished(replica))], die=False)


MODEL = ModelInfo(tokenizer=None, name="stand-in", path="", vocab_size=64, max_model_len=512)


def engine(streams) -> cluster_client.ClusterEngine:
    config = EngineConfig(tenant_quotas={"acme": TenantQuota(max_running=1, max_queued=0)})
    return cluster_client.ClusterEngine(Handle(streams), MODEL, config)


def finished(text: str = "ok") -> Finished:
    return Finished(FinishReason.EOS, Usage(prompt_tokens=3, uncached_tokens=3), text=text)


async def events_of(eng, request) -> list:
    return [event async for event in eng.submit(request)]


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(cluster_client, "RETRY_PAUSE_S", 0.0)


async def test_a_replica_dying_before_the_first_event_is_retried_elsewhere():
    eng = engine([Stream([], die=True), Stream([("r2", finished())], die=False)])
    out = await events_of(eng, Request([1, 2, 3], tenant="acme"))
    assert out == [finished()] and eng.handle.calls == 2
    assert eng.admission.running == {}


@pytest.fixture
def router():
    """A stand-in router, in the registry the client asks."""
    stand_in = Router()
    registry.register(stand_in)
    yield stand_in


async def test_the_retry_goes_to_another_replica_than_the_one_that_died(router):
    handle = RoutingHandle(["r1", "r2", "r3"], dying={"r1"}, router=router)
    config = EngineConfig(tenant_quotas={"acme": TenantQuota(max_running=1, max_queued=0)})
    eng = cluster_client.ClusterEngine(handle, MODEL, config)
    out = await events_of(eng, Request([1, 2, 3], tenant="acme"))
    assert out == [finished("r2")] and handle.tries == ["r1", "r2"]
    assert router.placements == {} and eng.admission.running == {}


async def test_each_retry_excludes_every_replica_that_died_under_the_request(router):
    handle = RoutingHandle(["r1", "r2", "r3"], dying={"r1", "r2"}, router=router)
    eng = cluster_client.ClusterEngine(handle, MODEL, EngineConfig())
    out = await events_of(eng, Request([1, 2, 3], tenant="acme"))
    assert out == [finished("r3")] and handle.tries == ["r1", "r2", "r3"]


async def test_a_replica_dying_mid_stream_ends_the_request_with_an_internal_error():
    delta = TextDelta("he", (5,))
    eng = engine([Stream([("r1", delta)], die=True)])
    out = await events_of(eng, Request([1, 2, 3], tenant="acme"))
    assert out[0] == delta and len(out) == 2 and eng.handle.calls == 1
    assert out[1].reason is FinishReason.ERROR and out[1].error_kind is ErrorKind.INTERNAL
    assert eng.admission.running == {}


async def test_replicas_that_keep_dying_end_the_request_overloaded_after_the_tries():
    eng = engine([Stream([], die=True) for _ in range(cluster_client.MAX_ATTEMPTS)])
    out = await events_of(eng, Request([1, 2, 3], tenant="acme"))
    assert len(out) == 1 and out[0].error_kind is ErrorKind.OVERLOADED
    assert eng.handle.calls == cluster_client.MAX_ATTEMPTS and eng.admission.running == {}


async def test_the_router_sends_a_retry_to_a_replica_the_request_does_not_exclude():
    pytest.importorskip("ray.serve")
    import gc
    from types import SimpleNamespace

    from ray.serve._private.common import DeploymentHandleSource, DeploymentID

    from radixgate.cluster.serve_router import RadixPrefixRouter

    def replica(name: str):
        return SimpleNamespace(replica_id=SimpleNamespace(unique_id=name), routing_stats={})

    from ray.serve._private.request_router.common import RequestRoutingContext

    def pending(request: Request, **kwargs):
        return SimpleNamespace(args=[request], kwargs=kwargs, routing_context=RequestRoutingContext(),
                               metadata=SimpleNamespace(internal_request_id=request.request_id))

    router = RadixPrefixRouter(DeploymentID(name="engines", app_name="test"),
                               DeploymentHandleSource.UNKNOWN)
    router.initialize_state(block_size=4)
    try:
        replicas = [replica(name) for name in ("r1", "r2", "r3")]
        request = Request(list(range(40)), tenant="acme")
        first = (await router.choose_replicas(replicas, pending(request)))[0][0].replica_id
        router.on_request_routed(pending(request), first, None)
        assert router.take_placement(request.request_id) == first.unique_id
        assert router.take_placement(request.request_id) is None       # told once
        retry = await router.choose_replicas(replicas, pending(request, exclude=(first.unique_id,)))
        ranked = [r.replica_id.unique_id for rank in retry for r in rank]
        assert sorted(ranked) == sorted({"r1", "r2", "r3"} - {first.unique_id})
        everyone = await router.choose_replicas(replicas, pending(request,
                                                                  exclude=("r1", "r2", "r3")))
        ranked = sorted(r.replica_id.unique_id for rank in everyone for r in rank)
        assert ranked == ["r1", "r2", "r3"]                              # none left: all
    finally:
        router.subscriber.close()
        del router
        gc.collect()


async def test_a_call_targeted_at_a_replica_that_is_gone_backs_off_instead_of_spinning_the_router():
    """Serve's routing loop asks the router again at once, without yielding, unless the
    router sets ``should_backoff``: a stats call targeted at a replica that died spun the
    router's event loop, and every later request of the gateway stalled behind it."""
    pytest.importorskip("ray.serve")
    import asyncio
    import gc
    from types import SimpleNamespace

    from ray.serve._private.common import DeploymentHandleSource, DeploymentID
    from ray.serve._private.request_router.common import RequestRoutingContext

    from radixgate.cluster.serve_router import RadixPrefixRouter

    router = RadixPrefixRouter(DeploymentID(name="engines", app_name="test"),
                               DeploymentHandleSource.UNKNOWN)
    router.initialize_state(block_size=4)
    from ray.serve._private.common import ReplicaID
    live = SimpleNamespace(replica_id=ReplicaID("r-live", DeploymentID(name="engines", app_name="test")),
                           routing_stats={})
    router._replicas, router._replicas_list = {live.replica_id: live}, [live]
    router.initial_backoff_s = 0.01
    pending = SimpleNamespace(args=["snapshot"], kwargs={"target": "r-dead"},
                              routing_context=RequestRoutingContext(),
                              metadata=SimpleNamespace(internal_request_id="x"))
    ticks, choices = 0, 0
    choose = router.choose_replicas

    async def counted_choose(*args, **kwargs):
        nonlocal choices
        choices += 1
        if choices > 1000:                            # bounds the spin when it is back
            raise AssertionError("Serve's routing loop asked 1000 times without backing off")
        return await choose(*args, **kwargs)

    router.choose_replicas = counted_choose

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.ensure_future(ticker())
    choosing = asyncio.ensure_future(router._choose_replicas_with_backoff(pending).__anext__())
    try:
        await asyncio.sleep(0.3)
        if choosing.done():
            choosing.result()                         # raises the spin's AssertionError
        assert not choosing.done()                    # nothing to route to: it waits
        assert ticks > 10, "the router's event loop was starved by its own routing loop"
        assert pending.routing_context.should_backoff
    finally:
        choosing.cancel()
        ticking.cancel()
        router.subscriber.close()
        del router
        gc.collect()
