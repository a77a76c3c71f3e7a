"""Run the whole benchmark suite: ``python -m benchmarks.run_all --quick|--full``.

1. memory sweep (``benchmarks.memory_sweep``: the KV manager and tree, no model; full-size traces
   in both modes, about 25 s);
2. the five workloads over HTTP against ``radixgate serve`` subprocesses with the default
   real model, one variant after the other: cache on and ``--page-rounded-match`` on every
   request, ``--no-prefix-cache`` on a sample (``--sample`` requests of each workload,
   spread over its arrival order: a server without a cache pays the same for a request
   whatever came before it); ``--variants plain_lru`` adds ``--policy lru`` (eviction
   without credits: compare it with a small ``--kv-cache-gb``);
3. the offline upper bound: each workload's token trace replayed with unlimited memory,
   each prompt followed by the reply the cache-on server generated for it
   (``benchmarks.replies``), as the engine caches prompt + output[:-1];
4. ``transformers`` ``generate`` on the same model and the same sample (sequential, full
   recompute); with ``--peers``, llama.cpp (llama-cpp-python + RAM prompt cache);
5. the other helpers' scripts in quick mode (``runtime_bench``, ``radix_ops``,
   ``kernels_bench``, ``seed_spread``); each is its own command with its own full mode.

A sampled system's ratios are taken against cache on's figures for the same requests.
Sizes: quick (``make bench``) keeps prefixes under ~512 tokens; full (``make bench-full``)
has the full-size prompts (``workloads.HTTP_FULL``) with fewer sessions. Both stay under 15
minutes on 2 cores. Writes ``results.json``, ``sweep.png``, ``http.png`` and ``workloads.md``
to ``benchmarks/out`` (full mode: ``benchmarks/out/full``).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
from tqdm import tqdm

from benchmarks import report
from benchmarks.http_runner import ClientConfig, run_workload, warm_up
from benchmarks.launch import (ADMIN_KEY, DEFAULT_VARIANTS, VARIANTS, ServerProcess, bench_spec,
                               tenant_key)
from benchmarks.memory_sweep import replay_radix, run_sweep
from benchmarks.replies import load_replies, prompt_key
from benchmarks.summary import spread_sample
from benchmarks.traces import load_tokenizer, workload_trace
from benchmarks.workloads import HTTP_FULL, WORKLOAD_NAMES, Workload, make_workloads

OTHER_SCRIPTS = ("runtime_bench", "radix_ops", "kernels_bench", "seed_spread")
SAMPLED_VARIANTS = ("cache_off",)    # no state between requests: a sample costs the same


def upper_bounds(traces: dict, replies: dict | None = None, block_size: int = 16) -> dict:
    """Offline upper bound per workload: unlimited memory, every reusable prefix reused,
    each request's prompt cached with ``replies[prompt_key(prompt)][:-1]`` after it (the
    reply's ids but the last, as the engine caches them; the prompt alone when the reply
    is unknown)."""
    replies = replies or {}
    out = {}
    for name, entries in traces.items():
        cached = [e.tokens + replies.get(prompt_key(e.tokens), ())[:-1] for e in entries]
        replay = replay_radix([(e.namespace, e.tokens) for e in entries], block_size, None,
                              cached=cached)
        out[name] = {"requests": len(entries), "prompt_tokens": replay.prompt_tokens,
                     "cache_read_tokens": replay.reused_tokens,
                     "prefill_tokens": replay.prompt_tokens - replay.reused_tokens,
                     "hit_rate": replay.hit_rate, "kv_blocks_peak": replay.peak_blocks,
                     "replies": sum(prompt_key(e.tokens) in replies for e in entries)}
    return out


def sample_indices(workload: Workload, n: int | None) -> list[int]:
    """Positions of the ``n`` requests a sampled system runs (all when ``n`` is None)."""
    return spread_sample(list(range(len(workload.requests))), n)


def sampled(workload: Workload, n: int | None) -> Workload:
    return replace(workload, requests=[workload.requests[i] for i in sample_indices(workload, n)])


def run_variant(variant: str, workloads, args) -> dict:
    """Start one server variant, run ``workloads`` against it, stop it: {"workloads":
    {name: summary with the server's CPU seconds}, ...}; a failure is recorded as
    ``"error"``. The cache-on server records its replies for the upper bound."""
    out: dict = {"args": list(VARIANTS[variant]), "workloads": {}}
    tenants = sorted({r.tenant for w in workloads for r in w.requests})
    server = ServerProcess(bench_spec(VARIANTS[variant], tenants, tiny=args.tiny,
                                      kv_cache_gb=args.kv_cache_gb,
                                      record_replies=variant == "radixgate"))
    started = time.perf_counter()
    try:
        server.start()
    except (RuntimeError, TimeoutError) as e:
        out["error"] = str(e)[-2000:]
        return out
    out["startup_s"] = round(time.perf_counter() - started, 1)
    cfg = ClientConfig(server.base_url, concurrency=args.concurrency, admin_key=ADMIN_KEY,
                       api_keys={t: tenant_key(t) for t in tenants},
                       cache_control=args.cache_control)
    try:
        warm = asyncio.run(warm_up(cfg, tenants[0]))
        out["warm_up"] = {"ok": warm.ok, "latency_s": warm.latency_s, "error": warm.error}
        with tqdm(total=sum(len(w.requests) for w in workloads), desc=f"http {variant}",
                  unit="req") as bar:
            for workload in workloads:
                cpu_before = server.cpu_seconds()
                try:
                    summary = asyncio.run(run_workload(cfg, workload, bar))
                except (RuntimeError, aiohttp.ClientError) as e:   # e.g. flush refused
                    out["error"] = f"{workload.name}: {type(e).__name__}: {e}"[-2000:]
                    break
                summary["cpu_s"] = round(server.cpu_seconds() - cpu_before, 2)
                out["workloads"][workload.name] = summary
        if server.spec.record_replies:
            out["replies"] = load_replies(server.reply_log)
    finally:
        server.stop()
    return out


def run_variants(results: dict, workloads, args) -> None:
    """Each server variant on the workloads (a sample of them for ``SAMPLED_VARIANTS``)."""
    for variant in [v for v in args.variants.split(",") if v]:
        todo = workloads
        if variant in SAMPLED_VARIANTS:
            todo = [sampled(w, args.sample) for w in workloads]
        results["http"][variant] = run_variant(variant, todo, args)
        if variant in SAMPLED_VARIANTS:
            mark_sample(results["http"][variant], workloads, args.sample)


def mark_sample(run: dict, workloads, n: int | None) -> None:
    """Record in each summary which requests of the workload the sample holds."""
    for workload in workloads:
        summary = (run.get("workloads") or {}).get(workload.name)
        if summary is not None:
            summary["sample_indices"] = sample_indices(workload, n)


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


OUT_DIR = Path(__file__).parent / "out"     # the checkout's benchmarks/out, from any folder


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Run the whole benchmark suite: the radix tree alone, the workloads over "
                    "HTTP against radixgate servers, the offline upper bound, the peers and "
                    "the other benchmark scripts")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sizes (the default)")
    mode.add_argument("--full", action="store_true",
                      help="full-size prompts, fewer sessions (default: off, quick sizes)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the workloads' generator (default 0)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where results.json, the plots and logs go (default: the "
                             "checkout's benchmarks/out, full mode benchmarks/out/full)")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="requests in flight per workload over HTTP (default 4)")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"server variants to run, comma separated, empty for none; of "
                             f"{', '.join(VARIANTS)} (default {','.join(DEFAULT_VARIANTS)})")
    parser.add_argument("--workloads", default="",
                        help="only these workloads, comma separated (default: all)")
    parser.add_argument("--cache-control", action="store_true",
                        help="mark system prompts and tool lists with cache_control "
                             "breakpoints (default: off)")
    parser.add_argument("--no-transformers", action="store_true",
                        help="skip the transformers baseline (default: it runs)")
    parser.add_argument("--sample", type=int, default=4,
                        help="cache off and transformers run N requests of each workload, "
                             "spread evenly over its arrival order (early and late turns); "
                             "0 = all (default 4)")
    parser.add_argument("--peers", action="store_true",
                        help="also llama.cpp when installed (default: off)")
    parser.add_argument("--no-scripts", action="store_true",
                        help="skip the other benchmark scripts (default: they run)")
    parser.add_argument("--tiny", action="store_true",
                        help="servers with small random weights (default: off, the real model)")
    parser.add_argument("--sweep-quick", action="store_true",
                        help="sweep the quick-size traces (default: full size in both modes; "
                             "the sweep runs no model and takes about 25 s)")
    parser.add_argument("--kv-cache-gb", type=float, default=None,
                        help="KV budget of each server in GiB, small for a run under "
                             "memory pressure (default 1, full mode 2)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="output tokens per request (default: the mode's)")
    return parser


def parse_args(argv):
    args = build_parser().parse_args(argv)
    args.quick = not args.full
    args.sample = args.sample or None
    if args.out is None:
        args.out = OUT_DIR if args.quick else OUT_DIR / "full"
    if args.kv_cache_gb is None:       # room for every workload's working set: no eviction
        args.kv_cache_gb = 1.0 if args.quick else 2.0
    return args


def set_max_tokens(workloads, max_tokens: int) -> None:
    """Every request asks for ``max_tokens`` output tokens (prompts unchanged)."""
    for w in workloads:
        w.requests = [replace(r, max_tokens=max_tokens) for r in w.requests]


def run(argv: list[str] | None = None) -> dict:
    """Run the suite; returns what it wrote to results.json."""
    args = parse_args(argv)
    command = "python -m benchmarks.run_all " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    results = {"date": _now(), "command": command.strip(), "mode": "quick" if args.quick else "full",
               "seed": args.seed, "machine": report.machine_info(), "commit": current_commit(),
               "sample": args.sample, "http": {}}
    results["sweep"] = run_sweep(args.quick and args.sweep_quick, args.seed, args.out)
    names = tuple(args.workloads.split(",")) if args.workloads else WORKLOAD_NAMES
    workloads = make_workloads(quick=args.quick, seed=args.seed, names=names,
                               scale=None if args.quick else HTTP_FULL)
    if args.max_tokens is not None:
        set_max_tokens(workloads, args.max_tokens)
    tokenizer = load_tokenizer()
    traces = {w.name: workload_trace(w, tokenizer) for w in workloads}
    run_variants(results, workloads, args)
    replies = (results["http"].get("radixgate") or {}).pop("replies", None)
    results["upper_bound"] = upper_bounds(traces, replies)
    if not args.no_transformers:
        run_transformers(results, workloads, traces, args)
    if args.peers:
        run_llama_cpp(results, workloads, traces)
    if not args.no_scripts:
        results["scripts"] = {name: run_other_script(name, True, args.out, 300)
                              for name in OTHER_SCRIPTS}
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    report.write_all(results, args.out)
    print((args.out / "workloads.md").read_text())
    return results


def run_transformers(results: dict, workloads, traces: dict, args) -> None:
    """transformers ``generate`` on each workload's sample."""
    from benchmarks.peers import transformers_baseline
    with tqdm(total=sum(len(sample_indices(w, args.sample)) for w in workloads),
              desc="transformers", unit="req") as bar:
        results["transformers"] = transformers_baseline(workloads, traces, bar, args.sample)
    mark_sample(results["transformers"], workloads, args.sample)


def run_llama_cpp(results: dict, workloads, traces: dict) -> None:
    """llama.cpp (when installed) on every request of each workload."""
    from benchmarks.peers import llama_cpp_available, llama_cpp_baseline
    if not llama_cpp_available():
        results["llama_cpp"] = {"error": "llama_cpp is not installed"}
        return
    results["llama_cpp"] = llama_cpp_baseline(workloads, traces)


def current_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, cwd=Path(__file__).parent
                              ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


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
    results = run(argv)
    problems = failures(results)
    for line in problems:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
