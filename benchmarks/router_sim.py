"""Routing across many replicas, simulated: radixgate's prefix router vs three baselines.

    python -m benchmarks.router_sim [--replicas 8,64,256,512] [--quick]

Replays the multi-tenant agent workload and a conversation trace (``benchmarks.workloads``
rendered to token ids by ``benchmarks.traces``, the gateway's own renderer and the default
tokenizer) over N simulated replicas, each with the real ``RadixTree`` and a KV budget of
total / N (``benchmarks.sim_cluster``: the latency model and its calibration). The traces
are scaled to at least ``--sessions-per-replica`` (50) sessions per replica: each rendered
template session is cloned with its own token ids after its tenant's shared prefix (so
clones share exactly what real sessions of a tenant share), tenants cloned with their own
namespaces. Routers:

- ``prefix``      ``cluster.policy.PrefixRouter``, the code the Ray Serve router runs, fed
                  by the replicas' KV events (``kv.events.blocks``);
- ``round_robin``, ``pow2`` (power of two choices, least loaded: Ray Serve's default);
- ``text_affinity`` Ray's ``PrefixCacheAffinityRouter``: a prefix tree of what it routed
                  (no namespaces, no knowledge of evictions), the longest match when it
                  covers >= 10% of the prompt, else the replicas that were sent the least,
                  the less loaded of the tied ones first.

Reports per N: hit rate (cached prompt tokens / prompt tokens) against one cache of the
same total size fed the same requests in the same order, load imbalance (max / mean busy
seconds per replica) and TTFT p50 / p99 of each router. Writes router_sim.json and
router_sim.png into ``--out``.
"""
from __future__ import annotations

import json
import multiprocessing
import random
import resource
import statistics
import time
from array import array
from dataclasses import replace
from pathlib import Path

from radixgate.kv import BlockPool, RadixTree
from radixgate.kv.events.blocks import prompt_block_ids

from benchmarks.cli import size_parser
from benchmarks.sim_cluster import Cluster, Rates
from radixgate.cluster.policy import PrefixRouter, RoutingParams

OUT_DIR = Path(__file__).parent / "out"
VOCAB = 49152
SEED = "sim-model|float32|16"
ROUTERS = ("prefix", "round_robin", "pow2", "text_affinity")
TEXT_AFFINITY_MATCH_RATE = 0.1       # Ray's PrefixCacheAffinityRouter default


# ---- routers ---------------------------------------------------------------------------

class PrefixPolicy:
    def __init__(self, block_size: int, params: RoutingParams):
        self.impl = PrefixRouter(SEED, block_size, params)
        self.seed, self.index = SEED, self.impl.index

    def choose(self, req, loads) -> int:
        return self.impl.rank(req.namespace, req.tokens, loads).ranked[0]


class RoundRobin:
    def __init__(self):
        self.next = 0

    def choose(self, req, loads) -> int:
        self.next = (self.next + 1) % len(loads)
        return self.next


class PowerOfTwo:
    def __init__(self, seed: int = 0):
        self.rng = random.Random(seed)

    def choose(self, req, loads) -> int:
        a, b = self.rng.sample(range(len(loads)), 2) if len(loads) > 1 else (0, 0)
        return a if loads[a] <= loads[b] else b


class TextAffinity:
    """What it routed, by prompt prefix (namespace-blind), never told of evictions."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.holders: dict[int, set[int]] = {}
        self.sent_blocks: dict[int, int] = {}

    def choose(self, req, loads) -> int:
        ids = prompt_block_ids("", "", req.tokens, self.block_size)
        alive, depth = set(loads), 0
        for block in ids:
            holding = self.holders.get(block, set()) & alive
            if not holding:
                break
            alive, depth = holding, depth + 1
        if depth * self.block_size >= TEXT_AFFINITY_MATCH_RATE * len(req.tokens) and depth:
            pool = alive
        else:
            fewest = min(self.sent_blocks.get(r, 0) for r in loads)
            pool = [r for r in loads if self.sent_blocks.get(r, 0) == fewest]
        best = min(pool, key=lambda r: (loads[r], r))
        for block in ids:
            holders = self.holders.setdefault(block, set())
            if best not in holders:
                holders.add(best)
                self.sent_blocks[best] = self.sent_blocks.get(best, 0) + 1
        return best


def make_router(name: str, block_size: int, params: RoutingParams):
    if name == "prefix":
        return PrefixPolicy(block_size, params)
    if name == "round_robin":
        return RoundRobin()
    if name == "pow2":
        return PowerOfTwo()
    return TextAffinity(block_size)


# ---- traces, scaled ----------------------------------------------------------------------

def template_sessions(quick: bool, names=("agents", "multi_turn")
                      ) -> dict[str, list[list[tuple[str, array, int]]]]:
    """Rendered sessions of the agent workload and the conversation trace."""
    from benchmarks.traces import load_tokenizer, workload_trace
    from benchmarks.workloads import FULL, make_workloads
    scale = replace(FULL, num_tenants=4 if quick else 8, tenant_prefix_tokens=1500,
                    loops_per_tenant=3, tool_calls_per_loop=3 if quick else 5,
                    observation_tokens=100, chat_conversations=12, chat_turns=4 if quick else 6,
                    chat_reply_tokens=100, max_tokens=16)
    tokenizer = load_tokenizer()
    out = {}
    for workload in make_workloads(quick=False, scale=scale, names=tuple(names)):
        sessions: dict[str, list] = {}
        for entry in workload_trace(workload, tokenizer):
            sessions.setdefault(entry.session, []).append(
                (entry.namespace, array("i", entry.tokens), scale.max_tokens))
        out[workload.name] = list(sessions.values())
    return out


def shared_prefix(sessions: list[list[tuple]]) -> int:
    """Tokens that every request of these sessions starts with (the tenant's prefix)."""
    first = sessions[0][0][1]
    n = len(first)
    for steps in sessions:
        for _, tokens, _ in steps:
            n = min(n, len(tokens))
            while n and tokens[:n] != first[:n]:
                n = _common(tokens, first, n)
    return n


def _common(a: array, b: array, limit: int) -> int:
    for i in range(limit):
        if a[i] != b[i]:
            return i
    return limit


class ScaledSessions:
    """``num_sessions`` sessions built from ``templates`` on demand (``sessions[k][step]``):
    clone ``k`` of a template keeps its tenant's shared prefix (in the clone's own tenant
    namespace) and shifts every later token id by its own offset, so clones share with
    each other exactly what real sessions of one tenant share."""

    def __init__(self, templates: list[list[tuple]], num_sessions: int,
                 sessions_per_tenant: int):
        by_tenant: dict[str, list] = {}
        for steps in templates:
            by_tenant.setdefault(steps[0][0], []).append(steps)
        self.groups = list(by_tenant.values())
        self.prefixes = [shared_prefix(g) for g in self.groups]
        self.num_sessions = num_sessions
        self.sessions_per_tenant = sessions_per_tenant

    def __len__(self) -> int:
        return self.num_sessions

    def __getitem__(self, k: int) -> "ScaledSession":
        tenant = k // self.sessions_per_tenant
        g = tenant % len(self.groups)
        return ScaledSession(self.groups[g][k % len(self.groups[g])], f"tenant{tenant}",
                             self.prefixes[g], 1 + k)


class ScaledSession:
    def __init__(self, steps, namespace: str, cut: int, offset: int):
        self.steps, self.namespace, self.cut, self.offset = steps, namespace, cut, offset

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, step: int) -> tuple[str, array, int]:
        _, tokens, max_tokens = self.steps[step]
        return self.namespace, _shifted(tokens, self.cut, self.offset), max_tokens


def _shifted(tokens: array, cut: int, offset: int) -> array:
    tail = array("i", ((t + offset) % VOCAB for t in tokens[cut:]))
    return tokens[:cut] + tail


# ---- measuring -------------------------------------------------------------------------

class OneCache:
    """One cache of the whole budget, fed the same requests in the same order (each as the
    engine admits it: match, reuse ``min(match, len - 1)``, allocate, insert, release)."""

    def __init__(self, total_blocks: int, block_size: int):
        self.pool = BlockPool(total_blocks, block_size)
        self.tree = RadixTree(self.pool)
        self.block_size = block_size
        self.hit = self.total = 0

    @property
    def hit_rate(self) -> float:
        return self.hit / max(1, self.total)

    def feed(self, namespace: str, tokens) -> None:
        pool, tree, B, n = self.pool, self.tree, self.block_size, len(tokens)
        match = tree.match(namespace, tokens)
        reuse = min(match.length, n - 1)
        keep = reuse // B
        pool.decref_many(match.blocks[keep:])
        need = -(-n // B) - keep
        if pool.num_free() < need:
            tree.evict(need - pool.num_free())
        self.hit, self.total = self.hit + reuse, self.total + n
        if pool.num_free() >= need:
            blocks = list(match.blocks[:keep]) + pool.allocate(need)
            tree.insert(namespace, tokens, blocks)
            pool.decref_many(blocks)
        else:
            pool.decref_many(match.blocks[:keep])
        tree.unlock(match.handle)


def measure(cluster: Cluster) -> dict:
    reqs = cluster.arrivals
    ttfts = sorted(r.ttft for r in reqs)
    busy = [r.busy_s for r in cluster.replicas]
    return {"hit_rate": sum(r.hit for r in reqs) / max(1, sum(r.num_tokens for r in reqs)),
            "imbalance": max(busy) / max(1e-9, statistics.fmean(busy)),
            "ttft_p50": _quantile(ttfts, 0.5), "ttft_p99": _quantile(ttfts, 0.99),
            "requests": len(reqs)}


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


_TEMPLATES: dict = {}       # workload -> template sessions (shared with forked workers)


def run_point(job) -> dict:
    workload, n, name, args, rates, params = job
    started = time.perf_counter()
    sessions = ScaledSessions(_TEMPLATES[workload], args.sessions_per_replica * n,
                              args.sessions_per_tenant)
    router = make_router(name, args.block_size, params)
    reference = OneCache(n * args.blocks_per_replica, args.block_size) if name == "prefix" else None
    cluster = Cluster(sessions, router, n, args.blocks_per_replica, args.block_size, rates,
                      n * args.sessions_per_s_per_replica, kv_events=(name == "prefix"),
                      on_arrival=reference.feed if reference is not None else None).run()
    point = {"workload": workload, "replicas": n, "router": name, "sessions": len(sessions),
             **measure(cluster)}
    if reference is not None:
        point["reference_hit_rate"] = reference.hit_rate
    point["wall_s"] = round(time.perf_counter() - started, 1)
    return point


def run(args) -> dict:
    rates = Rates(prefill_tok_s=args.prefill_tok_s)
    params = RoutingParams(balance_abs=args.balance_abs, balance_rel=args.balance_rel,
                           load_tokens=args.load_tokens)
    _TEMPLATES.update(template_sessions(args.quick, args.workloads))
    jobs = [(w, n, name, args, rates, params) for w in args.workloads for n in args.replicas
            for name in args.routers]
    jobs.sort(key=lambda j: -j[1] * (3 if j[2] == "prefix" else 1))   # longest first
    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "rates": vars(rates),
                     "points": []}
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for point in pool.imap_unordered(run_point, jobs):
            results["points"].append(point)
            print(json.dumps(point), flush=True)
    return results


def table(results: dict) -> str:
    rows = ["| workload | N | hit rate prefix / one cache (ratio) | hit rate rr / pow2 / text | "
            "imbalance prefix / rr / pow2 / text | TTFT p50 s prefix / rr / pow2 / text | "
            "TTFT p99 s prefix / rr / pow2 / text |", "|---|---|---|---|---|---|---|"]
    points = results["points"]
    keys = sorted({(p["workload"], p["replicas"]) for p in points})
    for workload, n in keys:
        by = {p["router"]: p for p in points if (p["workload"], p["replicas"]) == (workload, n)}
        pre = by["prefix"]
        others = [by[r] for r in ROUTERS[1:]]
        rows.append(
            f"| {workload} | {n} | {pre['hit_rate']:.3f} / {pre['reference_hit_rate']:.3f} "
            f"({pre['hit_rate'] / max(1e-9, pre['reference_hit_rate']):.2f}x) | "
            + " / ".join(f"{o['hit_rate']:.3f}" for o in others) + " | "
            + " / ".join(f"{p['imbalance']:.2f}" for p in [pre, *others]) + " | "
            + " / ".join(f"{p['ttft_p50']:.2f}" for p in [pre, *others]) + " | "
            + " / ".join(f"{p['ttft_p99']:.2f}" for p in [pre, *others]) + " |")
    return "\n".join(rows)


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    workloads = sorted({p["workload"] for p in results["points"]})
    fig, axes = plt.subplots(2, len(workloads), figsize=(5 * len(workloads), 6), squeeze=False)
    for col, workload in enumerate(workloads):
        for name in ROUTERS:
            pts = sorted((p for p in results["points"]
                          if p["workload"] == workload and p["router"] == name),
                         key=lambda p: p["replicas"])
            ns = [p["replicas"] for p in pts]
            axes[0][col].plot(ns, [p["hit_rate"] for p in pts], marker="o", label=name)
            axes[1][col].plot(ns, [p["ttft_p99"] for p in pts], marker="o", label=name)
        ref = sorted((p for p in results["points"]
                      if p["workload"] == workload and p["router"] == "prefix"),
                     key=lambda p: p["replicas"])
        axes[0][col].plot([p["replicas"] for p in ref], [p["reference_hit_rate"] for p in ref],
                          "k--", label="one cache")
        axes[0][col].set_title(f"{workload}: hit rate")
        axes[1][col].set_title(f"{workload}: TTFT p99 (s)")
        for ax in axes[:, col]:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("replicas")
        axes[1][col].set_yscale("log")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def parse_args(argv):
    p = size_parser(__doc__, quick="small traces and N (a smoke run)",
                    full="8-512 replicas, full traces", out=OUT_DIR)
    p.prog = "router_sim"
    p.add_argument("--replicas", default="8,64,256,512",
                   type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--workloads", default="agents,multi_turn", type=lambda s: s.split(","))
    p.add_argument("--routers", default=",".join(ROUTERS), type=lambda s: s.split(","))
    p.add_argument("--sessions-per-replica", type=int, default=50)
    p.add_argument("--sessions-per-tenant", type=int, default=10)
    p.add_argument("--sessions-per-s-per-replica", type=float, default=0.15,
                   help="how fast sessions open (per replica)")
    p.add_argument("--blocks-per-replica", type=int, default=1024)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--prefill-tok-s", type=float, default=Rates().prefill_tok_s)
    p.add_argument("--balance-abs", type=int, default=RoutingParams().balance_abs)
    p.add_argument("--balance-rel", type=float, default=RoutingParams().balance_rel)
    p.add_argument("--jobs", type=int, default=2, help="simulations run at once (processes)")
    p.add_argument("--load-tokens", type=int, default=RoutingParams().load_tokens)
    args = p.parse_args(argv)
    if args.quick and args.replicas == [8, 64, 256, 512]:
        args.replicas = [4, 16]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    results["wall_s"] = round(time.perf_counter() - started, 1)
    results["cpu_s"] = round(_cpu_seconds(), 1)
    (args.out / "router_sim.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / "router_sim.png")
    print(table(results))
    print(f"wall {results['wall_s']} s, CPU {results['cpu_s']} s (this process and its workers)")


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    workers = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


if __name__ == "__main__":
    main()
