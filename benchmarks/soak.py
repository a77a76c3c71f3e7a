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

``--churn N`` runs the salt churn instead (``salt_churn``): one tenant sends N requests, each
under a ``cache_salt`` never used before and with a prompt of a random length, so every
prompt is computed afresh in a namespace of its own; the report gives the server's resident
memory (VmRSS) as the churn goes and its growth over the second half, which a server that
bounds its per-namespace, per-request and per-shape state keeps within
``max(48 MB, 10%)`` (``churn_growth_limit_mb``). ``--default-model`` serves the real default
model instead of ``--tiny``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import aiohttp

from tests.support import client as c
from tests.support.load import LoadConfig, LoadReport, run_load
from benchmarks.launch import ADMIN_KEY, ServerProcess, ServerSpec, bench_spec, tenant_key

MB = 1024 * 1024
CHURN_TENANT = "acme"


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


# ---- salt churn: resident memory while every request opens a namespace of its own ----------

def vm_rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` (``VmRSS`` of /proc/PID/status), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise ValueError(f"no VmRSS for process {pid}")


def churn_growth_limit_mb(rss_at_half_mb: float) -> float:
    """The most resident memory the second half of a churn may add: 48 MB or 10%."""
    return max(48.0, 0.10 * rss_at_half_mb)


@dataclass
class ChurnResult:
    rss_mb: list[tuple[int, float]] = field(default_factory=list)   # (requests done, VmRSS)
    failures: list[str] = field(default_factory=list)               # broken answers
    wall_s: float = 0.0

    @property
    def requests(self) -> int:
        return self.rss_mb[-1][0] if self.rss_mb else 0

    def rss_at(self, done: int) -> float:
        """VmRSS at the first sample taken once ``done`` requests had finished."""
        return next(rss for n, rss in self.rss_mb if n >= done)

    @property
    def second_half_growth_mb(self) -> float:
        return self.rss_mb[-1][1] - self.rss_at(self.requests // 2)

    def summary(self) -> dict:
        half = self.rss_at(self.requests // 2) if self.rss_mb else 0.0
        return {"requests": self.requests, "wall_s": round(self.wall_s, 1),
                "rss_start_mb": round(self.rss_mb[0][1], 1) if self.rss_mb else None,
                "rss_half_mb": round(half, 1),
                "rss_end_mb": round(self.rss_mb[-1][1], 1) if self.rss_mb else None,
                "second_half_growth_mb": round(self.second_half_growth_mb, 1)
                if self.rss_mb else None,
                "limit_mb": round(churn_growth_limit_mb(half), 1),
                "rss_samples_mb": [(n, round(r, 1)) for n, r in self.rss_mb],
                "failures": self.failures[:10]}


def churn_request(rng: random.Random, index: int, max_words: int) -> tuple[str, dict]:
    """(path, body) of request ``index``: a salt of its own, a prompt of random length (so
    the engine's batches take many row counts), one output token; both APIs in turn."""
    prompt = c.words(rng, rng.randint(1, max_words))
    salt = f"churn-{index}-{rng.getrandbits(32):08x}"
    if index % 2:
        return c.CHAT_PATH, c.chat_body(prompt, max_tokens=1, cache_salt=salt)
    return c.ANTHROPIC_PATH, c.anthropic_body(prompt, max_tokens=1, cache_salt=salt)


async def salt_churn(base_url: str, pid: int, requests: int, *, key: str | None = None,
                     concurrency: int = 8, max_words: int = 200, samples: int = 20,
                     seed: int = 0) -> ChurnResult:
    """Send ``requests`` churn requests (``churn_request``) from ``concurrency`` clients and
    sample the server's VmRSS ``samples`` times along the way (and once before)."""
    key = key or tenant_key(CHURN_TENANT)
    rng = random.Random(seed)
    result = ChurnResult(rss_mb=[(0, vm_rss_mb(pid))])
    every = max(1, requests // samples)
    todo = iter(range(requests))
    done = 0
    started = time.monotonic()

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal done
        for index in todo:
            path, body = churn_request(rng, index, max_words)
            async with http.post(base_url + path, headers=c.headers(key), json=body) as r:
                problem = c.check_answer(path, False, r.status, await r.text(), 1)
            if problem or r.status != 200:
                result.failures.append(problem or f"status {r.status}")
            done += 1
            if done % every == 0 or done == requests:
                result.rss_mb.append((done, vm_rss_mb(pid)))

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    result.wall_s = time.monotonic() - started
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of one round")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="rounds (RSS drift across them)")
    ap.add_argument("--kv-cache-gb", type=float, default=0.002)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--churn", type=int, default=0, metavar="N",
                    help="run the salt churn: N requests, each under a new cache_salt")
    ap.add_argument("--default-model", action="store_true",
                    help="with --churn: serve the default model instead of --tiny")
    ap.add_argument("--json", help="also write the report to this file")
    args = ap.parse_args(argv)
    run = run_churn if args.churn else run_soak
    summary, bad = run(args)
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 1 if bad else 0


def run_soak(args) -> tuple[dict, bool]:
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
    bad = (summary["violations"] or summary["leaks"] or summary["server_log_errors"]
           or exit_code != 0)
    return summary, bool(bad)


def run_churn(args) -> tuple[dict, bool]:
    """The salt churn against a fresh server; bad when an answer broke or the second half
    grew resident memory past ``churn_growth_limit_mb``."""
    if args.default_model:
        spec = bench_spec(tenants=[CHURN_TENANT], kv_cache_gb=args.kv_cache_gb,
                          max_model_len=args.max_model_len)
    else:
        spec = ServerSpec(kv_cache_gb=args.kv_cache_gb, max_model_len=args.max_model_len)
    server = ServerProcess(spec).start()
    key = tenant_key(CHURN_TENANT)
    try:
        result = asyncio.run(salt_churn(server.base_url, server.proc.pid, args.churn, key=key,
                                        concurrency=min(args.clients, 16), seed=args.seed))
    finally:
        server.stop()
    summary = {"command": " ".join(sys.argv), "model": "default" if args.default_model
               else "tiny", **result.summary()}
    bad = result.failures or summary["second_half_growth_mb"] > summary["limit_mb"]
    return summary, bool(bad)


if __name__ == "__main__":
    sys.exit(main())
