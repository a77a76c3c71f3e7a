"""The router simulator on synthetic sessions: clones share only their tenant's prefix,
every replica's tree and pool stay consistent, and the prefix router keeps prefixes
together where round robin scatters them."""
from __future__ import annotations

import random
from array import array

from benchmarks.router_sim import OneCache, ScaledSessions, make_router, measure
from benchmarks.sim_cluster import Cluster, Rates
from radixgate.cluster.policy import RoutingParams

B = 16


def templates(num_tenants: int = 2, loops: int = 2, steps: int = 4) -> list[list[tuple]]:
    rng = random.Random(0)
    out = []
    for t in range(num_tenants):
        prefix = [rng.randrange(1, 40000) for _ in range(200)]
        for _ in range(loops):
            history = prefix + [rng.randrange(1, 40000) for _ in range(30)]
            session = []
            for _ in range(steps):
                session.append((f"t{t}", array("i", history), 4))
                history = history + [rng.randrange(1, 40000) for _ in range(40)]
            out.append(session)
    return out


def test_clones_share_their_tenant_prefix_and_nothing_else():
    sessions = ScaledSessions(templates(), num_sessions=8, sessions_per_tenant=4)
    a, b, c = sessions[0][0], sessions[1][0], sessions[4][0]
    assert a[0] == b[0] == "tenant0" and c[0] == "tenant1"
    assert a[1][:200] == b[1][:200] and a[1][200] != b[1][200]
    later = sessions[0][1][1]
    assert later[:len(a[1])] == a[1]               # a session's turns extend each other


def run(name: str, n: int = 4):
    sessions = ScaledSessions(templates(), num_sessions=40, sessions_per_tenant=10)
    router = make_router(name, B, RoutingParams())
    reference = OneCache(n * 64, B)
    cluster = Cluster(sessions, router, n, 64, B, Rates(), open_rate=2.0,
                      kv_events=(name == "prefix"), on_arrival=reference.feed).run()
    return cluster, measure(cluster), reference.hit_rate


def test_replicas_stay_consistent_and_every_request_is_served():
    for name in ("prefix", "round_robin", "pow2", "text_affinity"):
        cluster, result, _ = run(name)
        assert result["requests"] == 160
        for replica in cluster.replicas:
            replica.tree.check_integrity()
            assert replica.in_flight == 0 and replica.pool.num_free() + len(
                replica.tree.held_blocks()) == replica.pool.num_blocks


def test_the_prefix_router_reads_near_one_cache_and_more_than_round_robin():
    _, prefix, one_cache = run("prefix")
    _, round_robin, _ = run("round_robin")
    assert prefix["hit_rate"] >= 0.9 * one_cache
    assert prefix["hit_rate"] > round_robin["hit_rate"]
