"""Long soak runner: ``python -m benchmarks.soak --seconds 60 --clients 64``.

Starts ``radixgate serve --tiny`` on a free loopback port with a small KV budget (so
eviction and preemption happen), drives it with the load generator of
``tests/support/load.py`` (plus an admin client that checks integrity, flushes and
publishes/unpins prefixes while the load runs) for ``--rounds`` rounds of ``--seconds`` each, samples the
server's resident memory, and after each round waits until the server is idle and checks
that every block is free or cached and the admin integrity check is clean.

Prints one JSON report: requests served, outcomes and errors by kind, p50/p99 latency of
complete answers, RSS at idle after each round and its drift, and every violation.
Exit code 1 when any request hung, broke its envelope, got an undocumented 5xx, or a block
leaked.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

import aiohttp

from tests.support import client as c
from tests.support.load import LoadConfig, LoadReport, run_load
from tests.support.server import ADMIN_KEY, ServerProcess, ServerSpec, tenant_key

MB = 1024 * 1024


@dataclass
class SoakResult:
    report: LoadReport = field(default_factory=LoadReport)
    rss_during_mb: list[float] = field(default_factory=list)   # sampled under load
    rss_idle_mb: list[float] = field(default_factory=list)     # at idle after each round
    final_stats: dict = field(default_factory=dict)
    leaks: list[str] = field(default_factory=list)             # accounting / integrity problems
    log_errors: list[str] = field(default_factory=list)        # ERROR / Traceback lines logged

    @property
    def rss_drift_mb(self) -> float:
        """Idle RSS after the last round minus idle RSS after the first."""
        if len(self.rss_idle_mb) < 2:
            return 0.0
        return self.rss_idle_mb[-1] - self.rss_idle_mb[0]

    def summary(self) -> dict:
        out = self.report.summary()
        out.update({
            "evictions": self.final_stats.get("evictions", {}),
            "hit_rate": self.final_stats.get("hit_rate"),
            "rss_idle_mb": [round(x, 1) for x in self.rss_idle_mb],
            "rss_peak_mb": round(max(self.rss_during_mb, default=0.0), 1),
            "rss_median_under_load_mb": round(statistics.median(self.rss_during_mb), 1)
            if self.rss_during_mb else 0.0,
            "rss_drift_mb": round(self.rss_drift_mb, 1),
            "leaks": self.leaks,
            "server_log_errors": self.log_errors[:10],
            "first_violations": self.report.violations[:10]})
        return out


async def soak(server: ServerProcess, load: LoadConfig, rounds: int = 1,
               rss_interval_s: float = 1.0) -> SoakResult:
    """Run ``rounds`` rounds of ``load`` against ``server``; check idle state after each."""
    result = SoakResult()
    log_offset = _log_size(server)
    for _ in range(rounds):
        sampler = asyncio.create_task(_sample_rss(server, rss_interval_s, result.rss_during_mb))
        try:
            round_report = await run_load(load)
        finally:
            sampler.cancel()
        _merge(result.report, round_report)
        await _check_idle(server, result)
    result.log_errors = _log_errors(server, log_offset)
    return result


def _log_size(server: ServerProcess) -> int:
    try:
        return server.log_path.stat().st_size
    except OSError:
        return 0


def _log_errors(server: ServerProcess, offset: int) -> list[str]:
    """Lines at ERROR level or starting a traceback that the server logged since ``offset``."""
    with open(server.log_path, "rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", errors="replace")
    return [line for line in text.splitlines() if " ERROR " in line or line.startswith("Traceback")]


async def _sample_rss(server: ServerProcess, interval_s: float, out: list[float]) -> None:
    while True:
        out.append(server.rss_bytes() / MB)
        await asyncio.sleep(interval_s)


def _merge(total: LoadReport, part: LoadReport) -> None:
    total.outcomes.update(part.outcomes)
    total.statuses.update(part.statuses)
    total.latencies_s.extend(part.latencies_s)
    total.violations.extend(part.violations)
    total.wall_s += part.wall_s


async def _check_idle(server: ServerProcess, result: SoakResult) -> None:
    async with aiohttp.ClientSession() as session:
        try:
            stats = await c.wait_quiescent(session, server.base_url, ADMIN_KEY, timeout_s=60)
        except AssertionError as e:
            result.leaks.append(str(e))
            return
        result.final_stats = stats
        problem = c.block_accounting_violation(stats)
        if problem:
            result.leaks.append(problem)
        problem = await c.integrity_violation(session, server.base_url, ADMIN_KEY)
        if problem:
            result.leaks.append(problem)
    result.rss_idle_mb.append(server.rss_bytes() / MB)


def default_load(base_url: str, spec: ServerSpec, seconds: float, clients: int,
                 seed: int = 1234) -> LoadConfig:
    keys = {t: tenant_key(t) for t in spec.tenants[:4]}
    return LoadConfig(base_url=base_url, tenant_keys=keys, seconds=seconds, clients=clients,
                      seed=seed, admin_key=ADMIN_KEY)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of one round")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="rounds (RSS drift across them)")
    ap.add_argument("--kv-cache-gb", type=float, default=0.002)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", help="also write the report to this file")
    args = ap.parse_args(argv)
    spec = ServerSpec(kv_cache_gb=args.kv_cache_gb, max_model_len=args.max_model_len)
    server = ServerProcess(spec).start()
    try:
        started = time.monotonic()
        load = default_load(server.base_url, spec, args.seconds, args.clients, args.seed)
        result = asyncio.run(soak(server, load, rounds=args.rounds))
        summary = {"command": " ".join(sys.argv), "seconds_total": round(time.monotonic() - started, 1),
                   **result.summary()}
    finally:
        exit_code = server.stop()
    summary["server_exit_code"] = exit_code
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    bad = (summary["violations"] or summary["leaks"] or summary["server_log_errors"]
           or exit_code != 0)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
