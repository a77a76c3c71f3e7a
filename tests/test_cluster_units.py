"""Scale-out pieces that need no Ray: the gateway's deployment-wide tenant admission, the
summed snapshot, the [cluster] config and flags."""
from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from radixgate.cluster.admission import TenantAdmission
from radixgate.cluster.snapshot_merge import merge_snapshots
from radixgate.gateway.cli import build_parser, config_from_args
from radixgate.gateway.config import ConfigError, config_from_dict
from radixgate.runtime.engine.api import ErrorKind, Request
from radixgate.runtime.engine.engine_config import EngineConfig, TenantQuota
from radixgate.runtime.engine.snapshot import BlockCounts, TenantCounts, empty_snapshot


def admission(max_running: int, max_queued: int, max_queue: int = 256) -> TenantAdmission:
    quota = TenantQuota(max_running=max_running, max_queued=max_queued)
    return TenantAdmission(EngineConfig(tenant_quotas={"acme": quota}, max_queue=max_queue))


async def test_a_tenant_s_running_and_queued_quotas_hold_for_the_whole_deployment():
    gate = admission(max_running=1, max_queued=1)
    first, second, third = (Request([1], tenant="acme") for _ in range(3))
    assert await gate.enter(first) is None
    waiting = asyncio.ensure_future(gate.enter(second))
    await asyncio.sleep(0)
    assert not waiting.done()
    refusal = await gate.enter(third)
    assert refusal is not None and refusal[0] is ErrorKind.OVER_CAPACITY
    gate.leave(first)
    assert await waiting is None and gate.running == {"acme": 1}
    gate.leave(second)
    assert gate.running == {} and gate.num_waiting == 0


async def test_the_server_queue_bound_counts_every_tenant_s_waiters():
    gate = admission(max_running=1, max_queued=10, max_queue=1)
    assert await gate.enter(Request([1], tenant="acme")) is None
    waiting = asyncio.ensure_future(gate.enter(Request([1], tenant="acme")))
    await asyncio.sleep(0)
    refusal = await gate.enter(Request([1], tenant="acme"))
    assert refusal is not None and refusal[0] is ErrorKind.OVERLOADED
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert gate.num_waiting == 0


async def test_a_cancelled_waiter_gives_its_place_back():
    gate = admission(max_running=1, max_queued=1)
    first = Request([1], tenant="acme")
    assert await gate.enter(first) is None
    waiting = asyncio.ensure_future(gate.enter(Request([1], tenant="acme")))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.sleep(0)
    gate.leave(first)
    assert gate.running == {} and gate.num_waiting == 0


def test_replica_snapshots_sum_and_are_listed():
    def snap(free: int, running: int, pinned: int):
        return replace(empty_snapshot(100, 16), blocks=BlockCounts(100, free, 100 - free, 0, 0), running=running,
                       tenants={"acme": TenantCounts(running, 0, pinned)})
    merged = merge_snapshots({"r1": snap(60, 2, 10), "r0": snap(90, 1, 5)},
                             {"r0": 0.5}, {"r1": {"in_flight": 3}}, 16)
    assert merged.blocks == BlockCounts(200, 150, 50, 0, 0) and merged.running == 3
    assert merged.tenants["acme"] == TenantCounts(3, 0, 15)
    assert [(r.replica, r.hit_rate, r.in_flight) for r in merged.replicas] == [
        ("r0", 0.5, 0), ("r1", 0.0, 3)]


def test_replicas_and_kv_events_come_from_flags_and_the_config_file():
    args = build_parser().parse_args(["serve", "--replicas", "4", "--kv-events-endpoint",
                                      "tcp://127.0.0.1:5557"])
    config = config_from_args(args)
    assert config.cluster.replicas == 4 and config.cluster.enabled
    assert config.server.kv_events_endpoint == "tcp://127.0.0.1:5557"
    assert not config_from_dict({}).cluster.enabled
    scaled = config_from_dict({"cluster": {"replicas": 2, "min_replicas": 1, "max_replicas": 8}})
    assert scaled.cluster.max_replicas == 8
    assert config_from_dict({"cluster": {"routed_ttl_s": 0}}).cluster.routed_ttl_s == 0.0
    assert config_from_dict({}).cluster.routed_ttl_s == 30.0


@pytest.mark.parametrize("raw, problem", [
    ({"cluster": {"replicas": 0}}, "replicas"),
    ({"cluster": {"replicas": 9, "max_replicas": 4}}, "autoscaling"),
    ({"cluster": {"balance_rel": 0.5}}, "balance_rel"),
    ({"cluster": {"routed_ttl_s": -1}}, "routed_ttl_s"),
    ({"server": {"kv_events_endpoint": "tcp://0.0.0.0:5557"}}, "loopback"),
    ({"server": {"kv_events_replay_endpoint": "tcp://127.0.0.1:5558"}}, "needs"),
    ({"server": {"kv_events_endpoint": "tcp://127.0.0.1:5557",
                 "kv_events_replay_endpoint": "tcp://0.0.0.0:5558"}}, "replay_endpoint.*loopback"),
    ({"cluster": {"replica": 2}}, "unknown keys"),
])
def test_bad_cluster_settings_are_config_errors(raw, problem):
    with pytest.raises(ConfigError, match=problem):
        config_from_dict(raw)


RAY_FREE = ("radixgate.cluster", "radixgate.cluster.client", "radixgate.cluster.serve_app",
            "radixgate.cluster.replica", "radixgate.cluster.policy",
            "radixgate.cluster.admission", "radixgate.gateway.scaleout")


def test_the_cluster_package_imports_ray_only_in_serve_router():
    """What radixgate/cluster/__init__.py says: importing the package and its modules never imports
    Ray, except serve_router.py (which subclasses Serve's router at its top), which no
    module of the package imports (Serve loads it by serve_app.ROUTER_CLASS)."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    probe = "import sys\n" + "".join(f"import {m}\n" for m in RAY_FREE) + (
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    folder = Path(__file__).resolve().parent.parent / "radixgate" / "cluster"
    importers = [p.name for p in folder.glob("*.py") for node in ast.walk(ast.parse(p.read_text()))
                 if isinstance(node, ast.ImportFrom) and "serve_router" in (
                     (node.module or "") + "".join(a.name for a in node.names))]
    assert importers == []
    from radixgate.cluster.serve_app import ROUTER_CLASS
    assert ROUTER_CLASS == "radixgate.cluster.serve_router:RadixPrefixRouter"
    router_top = ast.parse((folder / "serve_router.py").read_text()).body
    assert any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("ray")
               for n in router_top)


def test_the_cluster_gateway_reads_the_tokenizer_and_config_but_builds_no_model(monkeypatch,
                                                                                 tmp_path):
    """``start_cluster_engine`` gives its ClusterEngine the model's facts from the config
    and tokenizer alone (``read_model_info``): the same facts a loaded model has, and no
    model is built in the gateway (the replicas load the weights)."""
    from radixgate.cluster import client, serve_app
    from radixgate.gateway import scaleout
    from radixgate.gateway.state import engine_config
    from radixgate.runtime.model import loader
    from tests.support.engine import tiny_model

    built = tiny_model().info
    config = config_from_dict({"model": {"tiny": True, "max_model_len": 512},
                               "cluster": {"replicas": 2, "ray_address": "auto"}})
    monkeypatch.setattr(loader, "load_model", _no_model)
    monkeypatch.setattr(loader, "LlamaModel", _no_model)
    monkeypatch.setattr(serve_app, "start_cluster", lambda settings, spec: "handle")
    engine = scaleout.start_cluster_engine(config, engine_config(config))
    assert isinstance(engine, client.ClusterEngine) and engine.handle == "handle"
    info = engine.model_info
    assert (info.name, info.vocab_size, info.max_model_len) == (built.name, built.vocab_size,
                                                                512)
    assert info.tokenizer.encode("a radix tree") == built.tokenizer.encode("a radix tree")
    assert engine.max_model_len == 512


def test_model_info_without_weights_matches_the_loaded_model(default_model_path):
    from radixgate.runtime.model.loader import read_model_info
    info = read_model_info("default", max_model_len=4096)
    assert (info.name, info.vocab_size, info.max_model_len) == ("smollm2-135m-instruct",
                                                                49152, 4096)
    assert info.path == str(default_model_path)


def _no_model(*args, **kwargs):
    raise AssertionError("the cluster gateway built a model")


class _Response:
    """A DeploymentResponse stand-in: awaited, it answers after ``delay_s`` (None: never)."""

    def __init__(self, name: str, delay_s: float | None):
        self.name, self.delay_s, self.cancelled = name, delay_s, False

    def __await__(self):
        return self._answer().__await__()

    async def _answer(self):
        if self.delay_s is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.delay_s)
        return self.name, "ok"

    def cancel(self) -> None:
        self.cancelled = True


async def test_a_broadcast_leaves_out_a_replica_that_leaves_while_its_call_waits(monkeypatch):
    """Serve's router holds a call targeted at a killed replica forever; the broadcast (stats,
    flush, pins) answers with the replicas still there instead of hanging, and still waits
    for a slow replica that stays."""
    from radixgate.cluster import client
    monkeypatch.setattr(client, "BROADCAST_PRESENCE_CHECK_S", 0.05)
    present = {"r-live", "r-slow", "r-dead"}
    responses = {}

    class Handle:
        class call:
            @staticmethod
            def remote(command, *args, target):
                responses[target] = _Response(target, {"r-live": 0.0, "r-slow": 0.3}.get(target))
                return responses[target]

    engine = client.ClusterEngine.__new__(client.ClusterEngine)
    engine.handle = Handle()
    monkeypatch.setattr(client.ClusterEngine, "replica_ids", lambda self: sorted(present))

    async def kill_later():
        await asyncio.sleep(0.1)
        present.discard("r-dead")
    killer = asyncio.ensure_future(kill_later())
    answers = await asyncio.wait_for(engine._broadcast("flush", None), timeout=5)
    await killer
    assert sorted(answers) == [("r-live", "ok"), ("r-slow", "ok")]
    assert responses["r-dead"].cancelled and not responses["r-slow"].cancelled


async def test_a_replica_that_stays_listed_but_never_answers_is_stale_for_stats_and_fails_a_command(
        monkeypatch):
    """A replica Serve still lists that never answers (killed but not yet noticed, a
    replacement still starting, stuck): stats answer without it within their deadline and
    mark it stale; a command fails with EngineUnavailable naming it (the gateway's 503)
    instead of holding the HTTP request."""
    from radixgate.cluster import client
    from radixgate.runtime.engine.api import EngineUnavailable
    monkeypatch.setattr(client, "BROADCAST_PRESENCE_CHECK_S", 0.05)
    monkeypatch.setattr(client, "SNAPSHOT_DEADLINE_S", 0.3)
    monkeypatch.setattr(client, "COMMAND_DEADLINE_S", 0.3)
    responses = {}

    class Handle:
        class call:
            @staticmethod
            def remote(command, *args, target):
                responses[target] = _Response(target, {"r-live": 0.0}.get(target))
                return responses[target]

    engine = client.ClusterEngine.__new__(client.ClusterEngine)
    engine.handle, engine.fresh, engine.stale = Handle(), {}, set()
    monkeypatch.setattr(client.ClusterEngine, "replica_ids", lambda self: ["r-live", "r-stuck"])
    monkeypatch.setattr(client.ClusterEngine, "snapshot", lambda self: sorted(self.stale))
    stale = await asyncio.wait_for(asyncio.wrap_future(engine.request_snapshot()), timeout=5)
    assert stale == ["r-stuck"] and engine.fresh == {"r-live": "ok"}
    assert responses["r-stuck"].cancelled
    with pytest.raises(EngineUnavailable, match="r-stuck"):
        await asyncio.wait_for(engine._broadcast("flush", None), timeout=5)
