"""Run the whole benchmark suite: ``python -m benchmarks.run_all --quick|--full``.

1. memory sweep (``benchmarks.memory_sweep``: RadixTree alone, no model; full-size traces
   in both modes since it takes about a minute);
2. the five workloads over HTTP against ``radixgate serve`` subprocesses with the default
   real model, one variant after the other: cache on, ``--no-prefix-cache``,
   ``--page-rounded-match`` (``--variants plain_lru`` adds ``--plain-lru``, eviction
   without credits: compare it with a small ``--kv-cache-gb``); plus the offline upper
   bound from the token traces;
3. ``transformers`` ``generate`` on the same model and prompts (sequential, full recompute);
4. with ``--peers``, llama.cpp (llama-cpp-python + RAM prompt cache) when installed;
5. the other helpers' scripts when present (``runtime_bench``, ``radix_ops``, ``kernels_bench``,
   ``seed_spread``: the sweep's goal ratios over several seeds).

Writes ``results.json``, ``sweep.png``, ``http.png`` and ``workloads.md`` to ``benchmarks/out``
(full mode: ``benchmarks/out/full``), saving ``results.json`` after every finished part so
that ``--resume`` can continue an interrupted run (``benchmarks.resume``).
Quick mode (``make bench``) keeps prefixes under ~512 tokens and requests few and short.
"""
from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
from tqdm import tqdm

from benchmarks import report
from benchmarks.checkpoint import (STATELESS_VARIANTS, PairCheckpoint, Unsaved,
                                  discard_all, discard_finished)
from benchmarks.http_runner import ClientConfig, run_workload, warm_up
from benchmarks.launch import ADMIN_KEY, DEFAULT_VARIANTS, VARIANTS, BenchServer, tenant_key
from benchmarks.memory_sweep import replay_radix, run_sweep
from benchmarks.resume import (ResumeMismatch, current_commit, finished_parts, load_previous,
                               open_part, run_settings, save_atomically)
from benchmarks.stats import spread_sample
from benchmarks.traces import load_tokenizer, workload_trace
from benchmarks.workloads import WORKLOAD_NAMES, make_workloads

OTHER_SCRIPTS = ("runtime_bench", "radix_ops", "kernels_bench", "seed_spread")


def upper_bounds(traces: dict, block_size: int = 16) -> dict:
    """Offline upper bound per workload: unlimited memory, every reusable prefix reused."""
    out = {}
    for name, entries in traces.items():
        replay = replay_radix([(e.namespace, e.tokens) for e in entries], block_size, None)
        out[name] = {"requests": len(entries), "prompt_tokens": replay.prompt_tokens,
                     "cache_read_tokens": replay.reused_tokens,
                     "prefill_tokens": replay.prompt_tokens - replay.reused_tokens,
                     "hit_rate": replay.hit_rate, "kv_blocks_peak": replay.peak_blocks}
    return out


def run_variant(variant: str, workloads, args, out: dict, save=lambda: None) -> None:
    """Start one server variant, run ``workloads`` against it (adding each summary to
    ``out["workloads"]`` and calling ``save`` after each), stop it. A failure is recorded
    as ``out["error"]``."""
    tenants = sorted({r.tenant for w in workloads for r in w.requests})
    server = BenchServer(VARIANTS[variant], tenants, tiny=args.tiny,
                         kv_cache_gb=args.kv_cache_gb)
    started = time.perf_counter()
    try:
        server.start()
    except (RuntimeError, TimeoutError) as e:
        out["error"] = str(e)[-2000:]
        return
    out["startup_s"] = round(time.perf_counter() - started, 1)
    cfg = ClientConfig(server.base_url, concurrency=args.concurrency, admin_key=ADMIN_KEY,
                       api_keys={t: tenant_key(t) for t in tenants},
                       cache_control=args.cache_control)
    try:
        warm = asyncio.run(warm_up(cfg, tenants[0]))
        out["warm_up"] = {"ok": warm.ok, "latency_s": warm.latency_s, "error": warm.error}
        total = sum(len(w.requests) for w in workloads)
        with tqdm(total=total, desc=f"http {variant}", unit="req") as bar:
            for workload in workloads:
                try:
                    summary, checkpoint = measure_workload(server, cfg, variant, workload,
                                                           args.out, bar, save)
                except (RuntimeError, aiohttp.ClientError) as e:   # e.g. flush refused
                    out["error"] = f"{workload.name}: {type(e).__name__}: {e}"[-2000:]
                    break
                out["workloads"][workload.name] = summary
                save()
                if not summary.get("errors"):
                    checkpoint.discard()      # else only the failed requests run again
    finally:
        server.stop()


def measure_workload(server: BenchServer, cfg: ClientConfig, variant: str, workload,
                     out_dir: Path, bar, save=lambda: None) -> tuple[dict, Unsaved]:
    """``workload``'s summary with the server's CPU seconds (``cpu_s``). On a variant that
    keeps no state between requests, each answered request is saved (then ``save()`` is
    called, keeping the run's time current) and those an interrupted invocation saved are
    not sent again but counted, wall time and CPU included (``benchmarks.checkpoint``); the
    checkpoint is returned so that it can be discarded once the summary is saved."""
    checkpoint = Unsaved()
    if variant in STATELESS_VARIANTS:
        checkpoint = PairCheckpoint.open(out_dir, variant, workload, on_record=save)
        if checkpoint.done:
            print(f"{variant}/{workload.name}: {len(checkpoint.done)} of "
                  f"{len(workload.requests)} requests answered in earlier invocations; "
                  "sending the rest", file=sys.stderr)
    checkpoint.start_segment(server.cpu_seconds)
    summary = asyncio.run(run_workload(cfg, workload, bar, checkpoint=checkpoint))
    summary["cpu_s"] = checkpoint.total_cpu_s()
    return summary, checkpoint


def run_variants(results: dict, workloads, args, save) -> None:
    """Each server variant on the workloads it has no saved summary for (all of them
    unless resuming); a variant with nothing left to do starts no server."""
    for variant in [v for v in args.variants.split(",") if v]:
        out, todo = open_part(results["http"], variant, workloads)
        out["args"] = list(VARIANTS[variant])
        if todo:
            run_variant(variant, todo, args, out, save)
            save()


def run_other_script(name: str, quick: bool, out_dir: Path, timeout_s: float) -> dict | None:
    """``python -m benchmarks.<name> --quick|--full --out OUT_DIR``: its JSON lands beside this
    run's results (retried with fewer flags if the script refuses them)."""
    if not (Path(__file__).parent / f"{name}.py").exists():
        return None
    log_path = out_dir / f"{name}.log"
    mode = "--quick" if quick else "--full"
    for flags in ([mode, "--out", str(out_dir)], [mode], []):
        started = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *flags],
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"returncode": None, "error": f"timed out after {timeout_s}s"}
        if proc.returncode == 2 and "unrecognized arguments" in proc.stderr:
            continue
        log_path.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        return {"returncode": proc.returncode, "flags": flags, "log": str(log_path),
                "elapsed_s": round(time.perf_counter() - started, 1),
                "stdout_tail": proc.stdout[-3000:]}
    return None


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sizes (default)")
    mode.add_argument("--full", action="store_true", help="the issue's full sizes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help="where results.json, the plots and logs go (default "
                             "benchmarks/out, full mode benchmarks/out/full: a quick run "
                             "never overwrites an hours-long full one)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"server variants to run (comma separated; empty for none): "
                             f"{', '.join(VARIANTS)}")
    parser.add_argument("--workloads", default="", help="only these workloads (comma separated)")
    parser.add_argument("--cache-control", action="store_true",
                        help="mark system prompts and tool lists with cache_control breakpoints")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--transformers-requests", type=int, default=None,
                        help="transformers runs only N requests of each workload, spread "
                             "evenly over its arrival order (early and late turns); 0 = all; "
                             "default 4 in quick mode, 16 in full mode (all 1,072 full-size "
                             "requests would take hours on 2 cores)")
    parser.add_argument("--peers", action="store_true", help="also llama.cpp when installed")
    parser.add_argument("--no-scripts", action="store_true", help="skip the other scripts")
    parser.add_argument("--tiny", action="store_true", help="servers with --tiny weights")
    parser.add_argument("--sweep-quick", action="store_true",
                        help="sweep the quick-size traces (default: full size in both modes; "
                             "the sweep runs no model and takes about a minute)")
    parser.add_argument("--kv-cache-gb", type=float, default=None,
                        help="KV budget of each server (small: a run under memory pressure)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="output tokens per request (default: the mode's)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run saved in --out/results.json (same settings): "
                             "only the (variant, workload) pairs, transformers workloads and "
                             "scripts it has not finished run")
    args = parser.parse_args(argv)
    args.quick = not args.full
    if args.out is None:
        args.out = Path("benchmarks/out" if args.quick else "benchmarks/out/full")
    if args.transformers_requests is None:
        args.transformers_requests = 4 if args.quick else 16
    if args.kv_cache_gb is None:
        args.kv_cache_gb = 1.0 if args.quick else 4.0
    return args


def set_max_tokens(workloads, max_tokens: int) -> None:
    """Every request asks for ``max_tokens`` output tokens (prompts unchanged)."""
    for w in workloads:
        w.requests = [replace(r, max_tokens=max_tokens) for r in w.requests]


def run(argv: list[str] | None = None) -> dict:
    """Run the suite (or, with ``--resume``, what an earlier run left undone); returns what
    it wrote to results.json."""
    args = parse_args(argv)
    command = "python -m benchmarks.run_all " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = _open_results(args, command.strip())
    this_run = {"date": _now(), "command": command.strip(), "commit": current_commit()}
    results.setdefault("runs", []).append(this_run)

    def save() -> None:
        this_run["elapsed_s"] = round(time.perf_counter() - started, 1)
        results["elapsed_s"] = round(sum(r.get("elapsed_s", 0) for r in results["runs"]), 1)
        save_atomically(results, args.out)

    save()                  # this invocation is listed even if it is killed in its first part

    if "sweep" not in results:
        results["sweep"] = run_sweep(args.quick and args.sweep_quick, args.seed, args.out)
        save()
    names = tuple(args.workloads.split(",")) if args.workloads else WORKLOAD_NAMES
    workloads = make_workloads(quick=args.quick, seed=args.seed, names=names)
    if args.max_tokens is not None:
        set_max_tokens(workloads, args.max_tokens)
    tokenizer = load_tokenizer()
    traces = {w.name: workload_trace(w, tokenizer) for w in workloads}
    results["upper_bound"].update(upper_bounds(traces))
    run_variants(results, workloads, args, save)
    if not args.no_transformers:
        run_transformers(results, workloads, traces, args, save)
    if args.peers:
        run_llama_cpp(results, workloads, traces, save)
    if not args.no_scripts:
        run_scripts(results, args, save)
    save()
    report.write_all(results, args.out)
    print((args.out / "workloads.md").read_text())
    return results


def _open_results(args, command: str) -> dict:
    """The saved results to continue (``--resume``, when there are any) or a new record."""
    settings = {**run_settings(args), "machine": report.machine_info()}
    previous = load_previous(args.out, settings) if args.resume else None
    if not previous:
        discard_all(args.out)            # another run's unfinished pairs
    if previous:
        done = finished_parts(previous)
        print(f"resuming {args.out / 'results.json'}: {len(done)} parts already done "
              f"({', '.join(done)})", file=sys.stderr)
        discard_finished(args.out, done)
    return previous or {"date": _now(), "command": command, "mode": settings["mode"],
                        "seed": args.seed, "machine": settings["machine"],
                        "settings": settings, "http": {}, "upper_bound": {}}


def run_transformers(results: dict, workloads, traces: dict, args, save) -> None:
    """transformers ``generate`` on the workloads it has no saved summary for."""
    from benchmarks.peers import transformers_baseline
    out, todo = open_part(results, "transformers", workloads)
    if not todo:
        return
    sample = args.transformers_requests or None
    with tqdm(total=sum(len(spread_sample(w.requests, sample)) for w in todo),
              desc="transformers", unit="req") as bar:
        transformers_baseline(todo, traces, bar, sample, out=out, on_workload=save)
    save()


def run_llama_cpp(results: dict, workloads, traces: dict, save) -> None:
    """llama.cpp (when installed) on the workloads it has no saved summary for."""
    from benchmarks.peers import llama_cpp_available, llama_cpp_baseline
    if not llama_cpp_available():
        results["llama_cpp"] = {"error": "llama_cpp is not installed"}
        return
    out, todo = open_part(results, "llama_cpp", workloads)
    if todo:
        llama_cpp_baseline(todo, traces, out=out, on_workload=save)
        save()


def run_scripts(results: dict, args, save) -> None:
    """The other scripts, except those that already succeeded in the saved results."""
    scripts = results.setdefault("scripts", {})
    for name in OTHER_SCRIPTS:
        if (scripts.get(name) or {}).get("returncode") == 0:
            continue
        scripts[name] = run_other_script(name, args.quick, args.out, 300 if args.quick else 3600)
        save()


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def failures(results: dict) -> list[str]:
    """What went wrong in a run: server variants that failed, requests that errored, a
    peer that failed (not merely absent), other scripts that failed or timed out."""
    out = []
    for variant, run_ in (results.get("http") or {}).items():
        if run_.get("error"):
            out.append(f"{variant}: {run_['error'][-300:]}")
        for name, summary in (run_.get("workloads") or {}).items():
            if summary.get("errors"):
                out.append(f"{variant}/{name}: {summary['errors']} failed requests, e.g. "
                           f"{(summary.get('error_samples') or [''])[0][:200]}")
    for peer in ("transformers", "llama_cpp"):
        error = (results.get(peer) or {}).get("error")
        if error and "not installed" not in error:
            out.append(f"{peer}: {error[-300:]}")
    for name, script in (results.get("scripts") or {}).items():
        if script and (script.get("error") or script.get("returncode") != 0):
            out.append(f"script {name}: {script.get('error') or 'exit ' + str(script.get('returncode'))}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m benchmarks.run_all`` and ``radixgate bench``: exit code
    (1 when anything in ``failures`` went wrong; the figures are written either way)."""
    try:
        results = run(argv)
    except ResumeMismatch as e:
        print(f"cannot resume: {e}", file=sys.stderr)
        return 2
    problems = failures(results)
    for line in problems:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
