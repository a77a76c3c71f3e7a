"""How much the memory sweep's goal ratio depends on the trace: the sweep for several seeds.

``benchmarks.memory_sweep`` replays one seeded trace per workload, so a policy tuned on
it can win by luck of the draw (a document asked again just before it would have been
evicted). This replays the same workloads generated with seeds ``0 .. N-1`` and reports,
per workload and budget, the spread of ``radixgate / Belady`` (the issue's goal: >= 0.9 at
budgets of 25% and more), of plain LRU's ratio beside it, and how many seeds have radixgate
at or above the page-rounded (hash-block) cache, with the worst gap (the issue's other goal),
and the ratios of the two session-aware oracles (``memory_sweep``: knowing which sessions will
come back, but not in what order). Run:
``python -m benchmarks.seed_spread [--quick|--full|--seeds N] [--first-seed S]`` (3 / 5 / N seeds of the
full-size traces, as the sweep in both bench modes uses; about 25 s a seed;
``--small-traces`` for the quick-size ones, seconds). ``run_all`` runs it with its mode.
"""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Sequence

from benchmarks.cli import size_parser
from benchmarks.memory_sweep import (FRACTIONS, SESSION_WORKLOADS, WorkloadSweep, pairs,
                                     session_ids, sweep_trace, sweep_traces, tool_call_flags)
from benchmarks.workloads import WORKLOAD_NAMES

GOAL_RATIO = 0.9
GOAL_FROM = 0.25
QUICK_SEEDS, FULL_SEEDS = 3, 5


@dataclass
class RatioSpread:
    """Ratios to Belady of one workload at one budget, one per seed (None: Belady reused
    nothing there, so there is no ratio). ``beat_empty_belady`` counts the seeds where
    whole-leaf Belady reused nothing but radixgate, trimming tails, did: they meet the goal
    without a finite ratio."""
    workload: str
    fraction: float
    radixgate: list[float | None] = field(default_factory=list)
    plain_lru: list[float | None] = field(default_factory=list)
    open_sessions: list[float | None] = field(default_factory=list)      # the oracles'
    open_sessions_now: list[float | None] = field(default_factory=list)
    over_page_rounded: list[float] = field(default_factory=list)   # hit-rate points
    beat_empty_belady: int = 0

    def summary(self, column: str) -> tuple[float, float, float] | None:
        """(mean, min, max) of ``column``'s ratios, None if no seed has one."""
        values = [v for v in getattr(self, column) if v is not None]
        if not values:
            return None
        return statistics.fmean(values), min(values), max(values)

    def seeds_meeting_goal(self) -> int:
        met = sum(1 for v in self.radixgate if v is not None and v >= GOAL_RATIO)
        return met + self.beat_empty_belady

    def seeds_judged(self) -> int:
        """Seeds where anyone reused something (where no one did, there is no goal to meet)."""
        return sum(1 for v in self.radixgate if v is not None) + self.beat_empty_belady

    def seeds_at_or_above_page_rounded(self) -> int:
        return sum(1 for gap in self.over_page_rounded if gap >= 0)


def _ratio(ours: float, belady: float) -> float | None:
    return ours / belady if belady > 0 else None


def collect(sweeps_by_seed: Sequence[list[WorkloadSweep]]) -> list[RatioSpread]:
    """One ``RatioSpread`` per (workload, budget), in the sweeps' order."""
    spreads: dict[tuple[str, float], RatioSpread] = {}
    for sweeps in sweeps_by_seed:
        for sweep in sweeps:
            for point in sweep.points:
                spread = spreads.setdefault((sweep.name, point.fraction),
                                            RatioSpread(sweep.name, point.fraction))
                spread.radixgate.append(_ratio(point.radixgate, point.belady))
                if point.belady == 0 and point.radixgate > 0:
                    spread.beat_empty_belady += 1
                spread.plain_lru.append(_ratio(point.plain_lru, point.belady))
                for oracle in ("open_sessions", "open_sessions_now"):
                    if getattr(point, oracle) is not None:
                        getattr(spread, oracle).append(_ratio(getattr(point, oracle), point.belady))
                spread.over_page_rounded.append(100 * (point.radixgate - point.page_rounded))
    return list(spreads.values())


def run_seeds(seeds: Sequence[int], quick: bool, fractions: Sequence[float] = FRACTIONS,
              progress=None) -> list[RatioSpread]:
    """Build and sweep every workload once per seed."""
    sweeps_by_seed = []
    for seed in seeds:
        traces = sweep_traces(quick, seed)
        sweeps_by_seed.append([sweep_trace(name, pairs(entries), fractions=fractions,
                                           progress=progress,
                                           tool_calls=tool_call_flags(entries),
                                           sessions=session_ids(entries))
                               for name, entries in traces.items()])
    return collect(sweeps_by_seed)


def _cell(summary: tuple[float, float, float] | None) -> str:
    if summary is None:
        return "-"
    mean, low, high = summary
    return f"{mean:.3f} ({low:.2f}-{high:.2f})"


def markdown(spreads: Sequence[RatioSpread]) -> str:
    """The spread table; "k of n" counts only the n seeds where anyone reused something."""
    lines = ["| workload | budget | radixgate / Belady: mean (min-max) | "
             f"seeds >= {GOAL_RATIO} | plain LRU / Belady: mean (min-max) | "
             "seeds >= page-rounded | worst gap to page-rounded (points) | "
             "open-sessions oracle / Belady: mean (min-max) | same, open now only |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in spreads:
        met = f"{s.seeds_meeting_goal()} of {s.seeds_judged()}" if s.seeds_judged() else "-"
        gaps = s.over_page_rounded
        worst = f"{min(gaps):+.2f}" if gaps else "-"
        lines.append(f"| {s.workload} | {s.fraction:.0%} | {_cell(s.summary('radixgate'))} | "
                     f"{met} | {_cell(s.summary('plain_lru'))} | "
                     f"{s.seeds_at_or_above_page_rounded()} of {len(gaps)} | {worst} | "
                     f"{_cell(s.summary('open_sessions'))} | "
                     f"{_cell(s.summary('open_sessions_now'))} |")
    return "\n".join(lines) + "\n"


def goal_by_workload(spreads: Sequence[RatioSpread]) -> dict[str, bool]:
    """Whether the mean ratio over seeds is >= GOAL_RATIO at every budget >= GOAL_FROM."""
    goal: dict[str, bool] = {}
    for s in spreads:
        summary = s.summary("radixgate")
        if s.fraction >= GOAL_FROM and summary is not None:
            goal[s.workload] = goal.get(s.workload, True) and summary[0] >= GOAL_RATIO
    return goal


def page_rounded_goal(spreads: Sequence[RatioSpread]) -> dict[str, bool]:
    """Whether radixgate is at or above page-rounded at every budget on every seed."""
    goal: dict[str, bool] = {}
    for s in spreads:
        ok = s.seeds_at_or_above_page_rounded() == len(s.over_page_rounded)
        goal[s.workload] = goal.get(s.workload, True) and ok
    return goal


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = size_parser(__doc__, quick=f"{QUICK_SEEDS} seeds", full=f"{FULL_SEEDS} seeds")
    parser.add_argument("--seeds", type=int, help="seeds 0 .. N-1 (overrides the mode's)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="start there instead of 0 (seeds the defaults were not tuned on)")
    parser.add_argument("--small-traces", action="store_true",
                        help="the quick-size traces (seconds; default: full size, as the "
                             "sweep of both bench modes)")
    args = parser.parse_args(argv)
    if args.seeds is None:
        args.seeds = QUICK_SEEDS if args.quick else FULL_SEEDS
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    from tqdm import tqdm

    args = parse_args(argv)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    traces_per_seed = len(WORKLOAD_NAMES) + len(SESSION_WORKLOADS)
    with tqdm(total=args.seeds * traces_per_seed * len(FRACTIONS), desc="seed spread",
              unit="point") as bar:
        spreads = run_seeds(seeds, quick=args.small_traces, progress=bar)
    table = markdown(spreads)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "seed_spread.md").write_text(table)
    (args.out / "seed_spread.json").write_text(json.dumps(
        {"seeds": list(seeds), "traces": "quick" if args.small_traces else "full",
         "spreads": [asdict(s) for s in spreads], "goal_mean": goal_by_workload(spreads),
         "at_or_above_page_rounded_every_seed": page_rounded_goal(spreads)},
        indent=1))
    print(table)


if __name__ == "__main__":
    main()
