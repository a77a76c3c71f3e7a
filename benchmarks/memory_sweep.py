"""Memory-pressure sweep: hit rate vs KV budget, replaying token traces without a model.

For each workload's token trace (``benchmarks.traces``) and each budget (a fraction of the
working set = blocks the trace holds with unlimited memory), requests are replayed one at a
time through the engine's own ``radixgate.kv.manager.KVManager`` (docs/ARCHITECTURE.md
section 2), with a KV object that copies nothing: ``match`` and ``admit`` (reuse
``min(matched, len - 1)`` tokens, a private copy of a partly reused last block, fresh
blocks for the rest), ``grow`` for what the server keeps after the prompt, ``release``
(insert what was computed, unlock, drop the request's references), then the tree evicts
down to the budget. The budget is the cache's capacity between requests; the running
request's blocks come on top of it. Policies:

- ``radixgate``     ``radixgate.kv.RadixTree`` with its own eviction: leaves'
                    partly filled last blocks first, then LRU with credits for expected
                    continuations and branching prefixes (``CreditPolicy``), trimming a
                    victim leaf's tail instead of dropping all of it when that frees enough. A request whose response is a tool
                    call (the session's next request carries it as an assistant
                    ``tool_use``) is followed by ``expect_continuation``, as the gateway does;
- ``plain_lru``     the same tree with plain LRU order (``LRUPolicy``: no credits, partial
                    blocks in LRU order with the rest);
- ``page_rounded``  a hash-block cache: ``PageRoundedKVManager`` (the tree holds
                    whole blocks only: a prompt's partial last block is computed but not
                    cached, so it takes no memory; reuse rounded down to whole blocks);
- ``belady``        ``benchmarks.belady.BeladyCache``: offline furthest-next-use eviction of
                    whole leaves (the issue's baseline);
- ``belady_trim``   the same oracle, trimming victims' tails as ``RadixTree`` does (so the
                    oracle gets every mechanism we have);
- ``open_sessions`` the simulator's ``open_sessions`` policy, trimming tails: it knows which
                    sessions will come back and what they will re-send, but not in what
                    order (Belady also knows the order). The next request comes from an
                    open session picked at random, so this is a closer reference than
                    Belady for what an online policy can reach on these traces. It is a
                    greedy rule with oracle knowledge, not a proven bound (radixgate beats
                    it at some budgets), and a yardstick beside the goal, not a rival;
- ``open_sessions_now`` the same knowing only the sessions open now (not later ones): for
                    agent loops, what a server can know (a loop whose answer was a tool
                    call comes back);
- ``upper_bound``   unlimited memory, every reusable prefix token reused.

The session workloads (multi_turn, agents) are swept twice: with their realistic arrivals
(``Scale.live_sessions`` open at once) and as ``<name>/all_open`` with every session open at
once, a stress trace without temporal locality where no online policy can know which session
speaks next.

Hit rate = reused prompt tokens / prompt tokens. Run: ``python -m benchmarks.memory_sweep``.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from radixgate.kv import BlockPool, CacheConfig, RadixTree, make_policy
from radixgate.kv.manager import KVManager
from radixgate.kv.page_rounded import PageRoundedKVManager
from radixgate.runtime.engine.api import Request
from radixgate.runtime.engine.sequence import Sequence as EngineSequence

from benchmarks.belady import SESSION_POLICIES, BeladyCache
from benchmarks.cli import size_parser

FRACTIONS = (0.05, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0)
SESSION_WORKLOADS = ("multi_turn", "agents")      # also swept with every session open
Trace = Sequence[tuple[str, Sequence[int]]]


@dataclass
class Replay:
    reused_tokens: int
    prompt_tokens: int
    peak_blocks: int

    @property
    def hit_rate(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class SweepPoint:
    fraction: float
    budget_blocks: int
    radixgate: float
    page_rounded: float
    belady: float
    belady_trim: float = 0.0
    plain_lru: float = 0.0
    open_sessions: float | None = None      # None: the trace's sessions were not given
    open_sessions_now: float | None = None


@dataclass
class WorkloadSweep:
    name: str
    requests: int
    prompt_tokens: int
    working_set_blocks: int
    upper_bound: float
    page_rounded_upper_bound: float
    points: list[SweepPoint] = field(default_factory=list)


def _blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class NoCopyKV:
    """The manager's KV object without a model: a private copy of a block copies nothing
    (the replay counts blocks, not their contents)."""

    def copy_blocks(self, pairs, valid_slots) -> None:
        pass


def replay_manager(capacity: int, block_size: int, policy: str = "credit",
                   round_to_block: bool = False) -> KVManager:
    """A ``KVManager`` over a pool of ``capacity`` blocks and a tree evicting by ``policy``
    (``round_to_block``: the page-rounded baseline, ``PageRoundedKVManager``)."""
    pool = BlockPool(capacity, block_size)
    tree = RadixTree(pool, policy=make_policy(CacheConfig(policy=policy)))
    manager = PageRoundedKVManager if round_to_block else KVManager
    return manager(tree, pool, NoCopyKV())


def serve(manager: KVManager, index: int, namespace: str, prompt: Sequence[int],
          kept: Sequence[int]) -> int:
    """One request through ``manager`` as the engine serves it: admitted with its cached
    prefix, grown to ``kept`` (its prompt and what follows), computed, released into the
    tree. Returns the prompt tokens it reused."""
    seq = EngineSequence(Request(list(prompt), namespace=namespace), arrival=index)
    manager.forget_probes()
    if not manager.admit(seq, manager.match(seq)):
        raise RuntimeError(f"request {index} found no room (the pool leaves room for the "
                           "largest request)")
    reused = seq.num_computed
    seq.tokens = list(kept)
    if not manager.grow(seq, len(kept)):
        raise RuntimeError(f"request {index} could not grow to {len(kept)} tokens")
    seq.num_computed = len(kept)
    manager.release(seq)
    return reused


def replay_radix(trace: Trace, block_size: int, budget_blocks: int | None,
                 round_to_block: bool = False, policy: str = "credit",
                 tool_calls: Sequence[bool] | None = None,
                 cached: Sequence[Sequence[int]] | None = None) -> Replay:
    """Replay through the engine's ``KVManager`` over the real ``RadixTree`` with eviction
    ``policy`` (``"credit"`` with its default parameters, or ``"lru"``); ``None`` =
    unlimited memory. ``round_to_block``: a hash-block cache (reuse and caching in whole
    blocks only). ``tool_calls[i]``: request ``i``'s response is a tool call (the tree is
    told to expect its continuation, as the gateway does). ``cached[i]``: what the server
    keeps after request ``i``, its prompt followed by more (the reply, as the engine caches
    it); default the prompt alone."""
    cached = cached or [t for _, t in trace]
    largest = max(_blocks(len(t), block_size) for t in cached)
    total = sum(_blocks(len(t), block_size) for t in cached)
    capacity = total + 1 if budget_blocks is None else budget_blocks + largest + 1
    manager = replay_manager(capacity, block_size, policy, round_to_block)
    tree, pool = manager.tree, manager.pool
    reused_total = prompt_total = peak = 0
    for index, (namespace, tokens) in enumerate(trace):
        reused_total += serve(manager, index, namespace, tokens, cached[index])
        if tool_calls is not None and tool_calls[index]:
            tree.expect_continuation(namespace, tokens)
        held = pool.num_blocks - pool.num_free()
        if budget_blocks is not None and held > budget_blocks:
            tree.evict(held - budget_blocks)
        peak = max(peak, pool.num_blocks - pool.num_free())
        prompt_total += len(tokens)
    return Replay(reused_total, prompt_total, peak)


def replay_belady(trace: Trace, block_size: int, budget_blocks: int | None,
                  round_to_block: bool = False, policy: str = "belady",
                  trim_tails: bool = False, sessions: Sequence[str] | None = None) -> Replay:
    """Replay through the simulator (offline Belady unless ``policy`` says otherwise);
    ``None`` = unlimited memory. ``sessions``: each request's session (``open_sessions``)."""
    cache = BeladyCache(trace, block_size, policy, trim_tails, sessions)
    reused_total = prompt_total = peak = 0
    for index, (namespace, tokens) in enumerate(trace):
        reused_total += cache.serve(namespace, index, round_to_block)
        prompt_total += len(tokens)
        if budget_blocks is not None:
            cache.evict_to(budget_blocks, now=index)
        peak = max(peak, cache.used_blocks)
    return Replay(reused_total, prompt_total, peak)


def sweep_trace(name: str, trace: Trace, block_size: int = 16,
                fractions: Sequence[float] = FRACTIONS, progress=None,
                tool_calls: Sequence[bool] | None = None,
                sessions: Sequence[str] | None = None) -> WorkloadSweep:
    unlimited = replay_radix(trace, block_size, None)
    working_set = unlimited.peak_blocks
    page_unlimited = replay_radix(trace, block_size, None, round_to_block=True)
    result = WorkloadSweep(name, len(trace), unlimited.prompt_tokens, working_set,
                           unlimited.hit_rate, page_unlimited.hit_rate)
    for fraction in fractions:
        budget = max(1, round(fraction * working_set))
        result.points.append(SweepPoint(
            fraction, budget,
            radixgate=replay_radix(trace, block_size, budget, tool_calls=tool_calls).hit_rate,
            page_rounded=replay_radix(trace, block_size, budget, round_to_block=True,
                                      tool_calls=tool_calls).hit_rate,
            belady=replay_belady(trace, block_size, budget).hit_rate,
            belady_trim=replay_belady(trace, block_size, budget, trim_tails=True).hit_rate,
            plain_lru=replay_radix(trace, block_size, budget, policy="lru").hit_rate,
            **_session_oracles(trace, block_size, budget, sessions)))
        if progress is not None:
            progress.update(1)
    return result


def _session_oracles(trace: Trace, block_size: int, budget: int,
                    sessions: Sequence[str] | None) -> dict[str, float]:
    """Hit rates of the two session-aware oracles (none without ``sessions``)."""
    if sessions is None:
        return {}
    return {policy: replay_belady(trace, block_size, budget, policy=policy, trim_tails=True,
                                  sessions=sessions).hit_rate
            for policy in ("open_sessions", "open_sessions_now")}


COMPARED_POLICIES = ("lru", "random", "gdsf", "popularity", "open_sessions",
                     "open_sessions_now", "belady")


def compare_policies(traces: dict[str, Trace], block_size: int = 16,
                     fractions: Sequence[float] = (0.1, 0.25, 0.35, 0.5),
                     policies: Sequence[str] = COMPARED_POLICIES,
                     tool_calls: dict[str, Sequence[bool]] | None = None,
                     sessions: dict[str, Sequence[str]] | None = None) -> str:
    """Markdown table: hit rate of radixgate's own eviction (``RadixTree``, told about
    ``tool_calls``) and of each simulator policy (all trimming tails as ``RadixTree``
    does) per workload and budget, and its ratio to Belady's. ``open_sessions`` needs the
    trace's ``sessions``, as ``open_sessions_now`` ("-" without them)."""
    columns = ["radixgate", *policies]
    lines = ["| workload | budget | " + " | ".join(columns) + " |",
             "|---|---:|" + "---:|" * len(columns)]
    for name, trace in traces.items():
        working_set = replay_radix(trace, block_size, None).peak_blocks
        for fraction in fractions:
            budget = max(1, round(fraction * working_set))
            trace_sessions = (sessions or {}).get(name)
            rates = {p: replay_belady(trace, block_size, budget, policy=p, trim_tails=True,
                                      sessions=trace_sessions).hit_rate
                     for p in policies if p not in SESSION_POLICIES or trace_sessions is not None}
            rates["radixgate"] = replay_radix(trace, block_size, budget,
                                              tool_calls=(tool_calls or {}).get(name)).hit_rate
            cells = [f"{rates[p]:.1%} ({_ratio(rates[p], rates['belady'])})" if p in rates
                     else "-" for p in columns]
            lines.append(f"| {name} | {fraction:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def goal_checks(sweeps: list[WorkloadSweep]) -> dict:
    """The eviction goals: ours >= 90% of Belady at budgets >= 25%; ours >= page-rounded always
    (and, for transparency, the first goal against the tail-trimming oracle too)."""
    within, within_trim, above = {}, {}, {}
    for s in sweeps:
        high = [p for p in s.points if p.fraction >= 0.25]
        within[s.name] = all(p.radixgate >= 0.9 * p.belady for p in high)
        within_trim[s.name] = all(p.radixgate >= 0.9 * p.belady_trim for p in high)
        above[s.name] = all(p.radixgate >= p.page_rounded for p in s.points)
    return {"within_10pct_of_belady_at_25pct_plus": within,
            "within_10pct_of_belady_trim_at_25pct_plus": within_trim,
            "at_or_above_page_rounded": above}


def markdown(sweeps: list[WorkloadSweep], header: str = "") -> str:
    lines = [header] if header else []
    for s in sweeps:
        lines += [f"\n#### {s.name}: {s.requests} requests, {s.prompt_tokens} prompt tokens, "
                  f"working set {s.working_set_blocks} blocks; upper bound (unlimited memory) "
                  f"{s.upper_bound:.1%} (page-rounded {s.page_rounded_upper_bound:.1%})\n",
                  "| budget | blocks | radixgate | plain LRU | page-rounded | Belady (offline) | "
                  "ours / Belady | Belady + tail trim | ours / (Belady + trim) | "
                  "open-sessions oracle / Belady | same, open now only / Belady |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for p in s.points:
            lines.append(f"| {p.fraction:.0%} | {p.budget_blocks} | {p.radixgate:.1%} | "
                         f"{p.plain_lru:.1%} | {p.page_rounded:.1%} | {p.belady:.1%} | "
                         f"{_ratio(p.radixgate, p.belady)} | {p.belady_trim:.1%} | "
                         f"{_ratio(p.radixgate, p.belady_trim)} | "
                         f"{_ratio(p.open_sessions, p.belady)} | "
                         f"{_ratio(p.open_sessions_now, p.belady)} |")
    return "\n".join(lines) + "\n"


def _ratio(ours: float | None, baseline: float) -> str:
    return f"{ours / baseline:.2f}" if baseline and ours is not None else "-"


def plot(sweeps: list[WorkloadSweep], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    columns = min(4, len(sweeps))
    rows = -(-len(sweeps) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(sweeps):]:
        ax.set_visible(False)
    for ax, s in zip(axes.flat, sweeps):
        xs = [p.fraction * 100 for p in s.points]
        ax.plot(xs, [p.belady * 100 for p in s.points], "k:", marker="s", label="Belady (offline)")
        ax.plot(xs, [p.belady_trim * 100 for p in s.points], "C7:", marker="x",
                label="Belady + tail trim")
        if all(p.open_sessions is not None for p in s.points):
            ax.plot(xs, [p.open_sessions * 100 for p in s.points], "C3:", lw=1, marker="+",
                    label="open-sessions oracle")
        ax.plot(xs, [p.radixgate * 100 for p in s.points], "C0-", marker="o", label="radixgate")
        ax.plot(xs, [p.plain_lru * 100 for p in s.points], "C4-", lw=1, marker=".",
                label="plain LRU")
        ax.plot(xs, [p.page_rounded * 100 for p in s.points], "C1--", marker="^",
                label="page-rounded")
        ax.axhline(s.upper_bound * 100, color="C2", ls="-.", lw=1, label="upper bound")
        ax.set_title(s.name)
        ax.set_xlabel("KV budget (% of working set)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("prompt tokens reused (%)")
    axes.flat[len(sweeps) - 1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sweep_traces(quick: bool, seed: int) -> dict[str, list]:
    """Trace entries (``benchmarks.traces.TraceEntry``) of every workload, plus
    ``<name>/all_open`` for the session workloads."""
    from benchmarks.traces import load_tokenizer, workload_trace
    from benchmarks.workloads import make_workloads

    tokenizer = load_tokenizer()
    workloads = make_workloads(quick=quick, seed=seed)
    for stress in make_workloads(quick=quick, seed=seed, names=SESSION_WORKLOADS,
                                 live_sessions=0):
        stress.name += "/all_open"
        workloads.append(stress)
    return {w.name: workload_trace(w, tokenizer) for w in workloads}


def pairs(entries) -> Trace:
    """``(namespace, tokens)`` of each trace entry."""
    return [(e.namespace, e.tokens) for e in entries]


def tool_call_flags(entries) -> list[bool]:
    return [e.ends_in_tool_call for e in entries]


def session_ids(entries) -> list[str]:
    return [e.session for e in entries]


def run_sweep(quick: bool, seed: int = 0, out_dir: Path = Path("benchmarks/out"),
              block_size: int = 16, fractions: Sequence[float] = FRACTIONS) -> dict:
    """Build the workloads, replay them at every budget, write sweep.{json,md,png}."""
    from tqdm import tqdm

    started = time.perf_counter()
    traces = sweep_traces(quick, seed)
    sweeps = []
    with tqdm(total=len(traces) * len(fractions), desc="memory sweep", unit="point") as bar:
        for name, entries in traces.items():
            sweeps.append(sweep_trace(name, pairs(entries), block_size, fractions, bar,
                                      tool_call_flags(entries), session_ids(entries)))
    result = {"mode": "quick" if quick else "full", "seed": seed, "block_size": block_size,
              "elapsed_s": round(time.perf_counter() - started, 2),
              "workloads": [asdict(s) for s in sweeps], "goals": goal_checks(sweeps)}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sweep.json").write_text(json.dumps(result, indent=1))
    (out_dir / "sweep.md").write_text(markdown(sweeps))
    plot(sweeps, out_dir / "sweep.png")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = size_parser(__doc__, quick="quick-size workloads", full="full-size workloads",
                         default="quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare-policies", action="store_true",
                        help="instead: hit rate of each simulator eviction policy "
                             "(writes policies.md)")
    args = parser.parse_args(argv)
    if args.compare_policies:
        traces = sweep_traces(args.quick, args.seed)
        table = compare_policies({n: pairs(e) for n, e in traces.items()},
                                 tool_calls={n: tool_call_flags(e) for n, e in traces.items()},
                                 sessions={n: session_ids(e) for n, e in traces.items()})
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "policies.md").write_text(table)
        print(table)
        return
    result = run_sweep(quick=args.quick, seed=args.seed, out_dir=args.out)
    print((args.out / "sweep.md").read_text())
    print(json.dumps(result["goals"], indent=1))


if __name__ == "__main__":
    main()
