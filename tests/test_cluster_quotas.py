"""Tenant quotas counted once for a deployment of replicas (radixgate/cluster/admission.py), through
``ClusterEngine`` over a fake Ray Serve handle and router (no Ray): a burst of pins between
two stats reports stays within ``max_pinned_tokens``, and ``max_namespaces`` holds over all
replicas (the least recently used idle namespace is retired on every replica)."""
from __future__ import annotations

import asyncio
import gc

import pytest

from radixgate.cluster import registry
from radixgate.cluster.admission import SETTLE_TIMEOUT_S
from radixgate.cluster.client import ClusterEngine
from radixgate.kv import BlockPool, RadixTree
from radixgate.runtime.engine.api import Breakpoint, Finished, FinishReason, Request, Usage
from radixgate.runtime.engine.engine_config import EngineConfig, TenantQuota
from radixgate.runtime.model.model_info import ModelInfo
from tests.support.radix import cache

REPLICAS = ("replica-a", "replica-b")


class FakeRouter:
    """What ``ClusterEngine`` reads of the Serve router: the replicas' last reports."""

    def __init__(self):
        self.reports = {name: {"replica": name, "pinned_tokens": {}, "pins_settled": []}
                        for name in REPLICAS}

    def replica_stats(self):
        return [dict(r) for r in self.reports.values()]

    def replica_ids(self):
        return list(REPLICAS)

    def request_done(self, replica, request_id):
        pass


class FakeStream:
    def __init__(self, replica: str, request: Request):
        self.events = iter([(replica, Finished(FinishReason.LENGTH, Usage(len(request.tokens)),
                                               request_id=request.request_id))])

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return next(self.events)
        except StopIteration:
            raise StopAsyncIteration from None

    def cancel(self):
        pass


class FakeHandle:
    """Requests go to the replicas in turn; commands are recorded per replica."""

    def __init__(self):
        self.turn = 0
        self.commands: list[tuple[str, str, tuple]] = []
        self.call = self
        self.generate = self

    def options(self, stream: bool = False):
        return self

    def remote(self, *args, target: str | None = None):
        if isinstance(args[0], Request):
            self.turn += 1
            return FakeStream(REPLICAS[self.turn % 2], args[0])
        return self._command(target, args[0], args[1:])

    async def _command(self, target, command, args):
        self.commands.append((target, command, args))
        return target, 0


MODEL = ModelInfo(tokenizer=None, name="stand-in", path="", vocab_size=64, max_model_len=4096)


@pytest.fixture
def cluster(monkeypatch):
    router = FakeRouter()
    registry.register(router)
    made = []

    def build(**quota) -> ClusterEngine:
        config = EngineConfig(tenant_quotas={"acme": TenantQuota(**quota)})
        engine = ClusterEngine(FakeHandle(), MODEL, config, started_ray=False)
        made.append(engine)
        return engine
    yield router, build
    del router, made
    gc.collect()                               # the registry holds routers weakly


def pinning(offset: int, ttl_s: float = 300.0, namespace: str = "acme") -> Request:
    return Request(list(range(offset + 8)), tenant="acme", namespace=namespace,
                   breakpoints=(Breakpoint(offset, ttl_s),))


async def run(engine: ClusterEngine, request: Request) -> Request:
    """Submits ``request`` and reads it to its end; the request as it was sent."""
    handle = engine.submit(request)
    async for _ in handle:
        pass
    return handle.request


async def test_a_burst_of_pins_between_two_reports_cannot_overrun_the_quota(cluster):
    router, build = cluster
    engine = build(max_pinned_tokens=100)
    clock = [1000.0]
    engine.admission.pins.clock = lambda: clock[0]
    burst = [engine.submit(pinning(40)).request for _ in range(5)]   # no report in between
    kept = [r for r in burst if r.breakpoints]
    assert len(kept) == 2                      # 40 + 40 within 100, a third would be 120
    shallow = engine.submit(Request(list(range(64)), tenant="acme", breakpoints=(
        Breakpoint(16, 300.0), Breakpoint(48, 300.0)))).request
    assert shallow.breakpoints == (Breakpoint(16, 300.0),)   # the part that fits is kept

    for request in burst + [shallow]:          # they end; no report covers them yet
        engine.admission.pins.ended(request)
    assert not engine.submit(pinning(16)).request.breakpoints

    # the report that includes their pins releases the reservations: it counts them now
    router.reports["replica-a"].update(pinned_tokens={"acme": 96},
                                       pins_settled=[r.request_id for r in kept + [shallow]])
    last = engine.submit(pinning(4)).request
    assert last.breakpoints
    assert not engine.submit(pinning(4)).request.breakpoints      # 96 + 4 + 4 > 100

    # a reservation no report covers (its replica left) goes a while after its end
    router.reports["replica-a"].update(pinned_tokens={}, pins_settled=[])
    engine.admission.pins.ended(last)
    assert not engine.submit(pinning(100)).request.breakpoints    # 4 still reserved
    clock[0] += SETTLE_TIMEOUT_S + 1
    assert engine.submit(pinning(100)).request.breakpoints


async def test_a_pin_that_never_reaches_a_replica_gives_its_reservation_back(cluster):
    _, build = cluster
    engine = build(max_pinned_tokens=100, max_running=1, max_queued=1)
    first = engine.submit(pinning(60)).request
    assert await engine.admission.enter(first) is None
    waiter = engine.submit(pinning(30)).request
    waiting = asyncio.ensure_future(engine.admission.enter(waiter))
    await asyncio.sleep(0)
    refused = engine.submit(pinning(8)).request
    assert (await engine.admission.enter(refused))[0].name == "OVER_CAPACITY"
    assert engine.admission.pins.reserved_tokens("acme") == 60 + 30
    waiting.cancel()                           # its client left while it waited
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert engine.admission.pins.reserved_tokens("acme") == 60
    engine.admission.leave(first)


async def test_max_namespaces_counts_the_whole_deployment_and_retires_on_every_replica(cluster):
    _, build = cluster
    engine = build(max_namespaces=2)
    for name in ("ns-0", "ns-1", "ns-2"):       # requests alternate between the two replicas
        await run(engine, Request([1, 2, 3], tenant="acme", namespace=name))
    await asyncio.sleep(0.05)
    retired = [(target, args) for target, command, args in engine.handle.commands
               if command == "retire_namespace"]
    assert sorted(retired) == [(name, ("ns-0",)) for name in REPLICAS]
    assert engine.admission.namespaces.count("acme") == 2

    busy = engine.submit(Request([1], tenant="acme", namespace="ns-1"))
    assert await engine.admission.enter(busy.request) is None        # ns-1 is in flight
    await run(engine, pinning(8, ttl_s=60.0, namespace="ns-pinned"))
    await run(engine, Request([1], tenant="acme", namespace="ns-3"))
    await asyncio.sleep(0.05)
    retired = {args[0] for _, command, args in engine.handle.commands
               if command == "retire_namespace"}
    assert retired == {"ns-0", "ns-2"}         # not the busy one, nor the pinned one
    engine.admission.leave(busy.request)


def test_retiring_a_namespace_keeps_its_pinned_path_and_leaves_an_open_one_alone():
    pool = BlockPool(64, 4)
    tree = RadixTree(pool)
    cache(pool, tree, [1] * 8 + [2] * 8, "pinned")
    tree.pin("pinned", [1] * 8, ttl_s=100)
    cache(pool, tree, [3] * 8, "idle")
    tree.open_namespace("open", "acme")
    cache(pool, tree, [4] * 8, "open")
    assert tree.retire_namespace("idle") == 2 and tree.namespace("idle") is None
    assert tree.retire_namespace("pinned") == 2
    assert tree.peek_length("pinned", [1] * 8 + [2] * 8) == 8      # the pinned part stays
    assert tree.retire_namespace("open") == 0 and tree.peek_length("open", [4] * 8) == 8
    assert tree.retire_namespace("never-seen") == 0
    tree.close_namespace("open")
    tree.check_integrity()
