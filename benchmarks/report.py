"""Markdown tables and PNG plots of a ``run_all`` result (``benchmarks/out/workloads.md``)."""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from benchmarks.memory_sweep import SweepPoint, WorkloadSweep, markdown as sweep_markdown
from benchmarks.summary import summarize

SYSTEM_LABELS = {"radixgate": "radixgate (cache on)", "cache_off": "radixgate --no-prefix-cache",
                 "page_rounded": "radixgate --page-rounded-match",
                 "plain_lru": "radixgate --policy lru",
                 "upper_bound": "offline upper bound", "transformers": "transformers generate",
                 "llama_cpp": "llama.cpp + RAM cache"}


def save_report(report: dict, out_dir: Path, name: str, mode: str, argv: list[str]) -> Path:
    """A side-by-side benchmark's report with its command, as ``out_dir/name[_mode].json``
    (no suffix for the default size)."""
    report["command"] = f"python -m benchmarks.{name} " + " ".join(argv)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (f"{name}.json" if mode == "default" else f"{name}_{mode}.json")
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version()}


def systems(results: dict) -> dict[str, dict]:
    """system name -> {workload name: summary}, in table order."""
    out: dict[str, dict] = {}
    for variant, run in (results.get("http") or {}).items():
        out[variant] = run.get("workloads") or {}
    if results.get("upper_bound"):
        out["upper_bound"] = results["upper_bound"]
    for peer in ("transformers", "llama_cpp"):
        if (results.get(peer) or {}).get("workloads"):
            out[peer] = results[peer]["workloads"]
    return out


def _fmt(value, pattern: str = "{}") -> str:
    return "-" if value is None else pattern.format(value)


def _row(label: str, s: dict) -> str:
    ttft, itl, tput = s.get("ttft_ms") or {}, s.get("itl_ms") or {}, s.get("throughput") or {}
    return (f"| {label} | {s.get('prompt_tokens', '-')} | {_fmt(s.get('prefill_tokens'))} | "
            f"{_fmt(s.get('hit_rate'), '{:.1%}')} | {_fmt(ttft.get('p50'))} | "
            f"{_fmt(ttft.get('p95'))} | {_fmt(ttft.get('p99'))} | {_fmt(itl.get('mean'))} | "
            f"{_fmt(tput.get('requests_per_s'))} | {_fmt(tput.get('output_tok_per_s'))} | "
            f"{_fmt(s.get('cpu_s'))} | {_fmt(s.get('kv_blocks_peak'))} | {s.get('errors', 0)} |")


def _label(system: str, summary: dict) -> str:
    label = SYSTEM_LABELS.get(system, system)
    sample = summary.get("sample_indices")
    return label if sample is None else f"{label}, {len(sample)} requests"


def http_tables(results: dict) -> str:
    table = systems(results)
    names = list(results.get("upper_bound") or {})
    lines = []
    for name in names:
        lines += [f"\n#### {name}\n",
                  "| system | prompt tok | prefill tok | hit rate | TTFT p50 ms | p95 | p99 | "
                  "ITL ms | req/s | out tok/s | CPU s | KV blocks peak | errors |",
                  "|---|" + "---:|" * 12]
        lines += [_row(_label(k, v[name]), v[name]) for k, v in table.items() if name in v]
    return "\n".join(lines) + "\n"


def cpu(summary: dict) -> float | None:
    """CPU seconds per request (the transformers baseline may run a sample of requests)."""
    if summary.get("cpu_s") is None or not summary.get("requests"):
        return None
    return summary["cpu_s"] / summary["requests"]


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _compare(x: dict, y: dict, get) -> str:
    """``get(x) / get(y)``; not given when either side lost requests (its totals and
    percentiles would cover other requests than the other side's)."""
    if x.get("errors") or y.get("errors"):
        return "n/a (errors)"
    return _ratio(get(x), get(y))


def per_request(summary: dict, key: str) -> float | None:
    """``summary[key]`` per successful request."""
    done = (summary.get("requests") or 0) - (summary.get("errors") or 0)
    value = summary.get(key)
    return value / done if value is not None and done > 0 else None


def same_requests(on: dict, other: dict) -> dict:
    """Cache on's summary restricted to the requests ``other`` ran (a sampled system's
    ``sample_indices``; no wall time, so no throughput), else ``on`` itself."""
    indices, results = other.get("sample_indices"), on.get("results")
    if indices is None or not results or len(indices) == len(results):
        return on
    return {**summarize([results[i] for i in indices], 0.0), "cpu_s": None}


def ratio_table(results: dict) -> str:
    """Side-by-side ratios from the same run: what the cache buys. Against a sampled
    system, prefill tokens and TTFT are cache on's for the same requests; CPU per request
    is cache on's mean over the whole workload."""
    table = systems(results)
    on, off = table.get("radixgate", {}), table.get("cache_off", {})
    page, hf = table.get("page_rounded", {}), table.get("transformers", {})
    lines = ["| workload | hit rate (on / page-rounded / upper bound) | prefill tokens "
             "page-rounded / on | prefill tokens off / on | TTFT p50 off / on | "
             "TTFT p50 transformers / on | CPU s per request off / on | "
             "CPU s per request transformers / on |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, ub in (results.get("upper_bound") or {}).items():
        o, f, p, h = on.get(name, {}), off.get(name, {}), page.get(name, {}), hf.get(name, {})
        hits = " / ".join(_fmt(x, "{:.1%}") for x in (o.get("hit_rate"), p.get("hit_rate"),
                                                     ub.get("hit_rate")))
        p50 = lambda s: (s.get("ttft_ms") or {}).get("p50")  # noqa: E731
        prefill = lambda s: s.get("prefill_tokens")  # noqa: E731
        of, oh = same_requests(o, f), same_requests(o, h)
        lines.append(f"| {name} | {hits} | {_compare(p, o, prefill)} | "
                     f"{_compare(f, of, prefill)} | {_compare(f, of, p50)} | "
                     f"{_compare(h, oh, p50)} | {_compare(f, o, cpu)} | {_compare(h, o, cpu)} |")
    return "\n".join(lines) + "\n"


def _sweeps(results: dict) -> list[WorkloadSweep]:
    out = []
    for w in results["sweep"]["workloads"]:
        points = [SweepPoint(**p) for p in w["points"]]
        out.append(WorkloadSweep(**{**w, "points": points}))
    return out


def plot_http(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    table = systems(results)
    names = list(results.get("upper_bound") or {})
    metrics = (("hit rate (%)", lambda s: 100 * (s.get("hit_rate") or 0)),
               ("TTFT p50 (ms)", lambda s: (s.get("ttft_ms") or {}).get("p50") or 0),
               ("CPU seconds per request", lambda s: cpu(s) or 0),
               ("prefill tokens per request", lambda s: per_request(s, "prefill_tokens") or 0))
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 4))
    width = 0.8 / max(1, len(table))
    for ax, (title, get) in zip(axes, metrics):
        for i, (system, per_workload) in enumerate(table.items()):
            xs = [j + i * width for j in range(len(names))]
            ax.bar(xs, [get(per_workload.get(n, {})) for n in names], width,
                   label=SYSTEM_LABELS.get(system, system))
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=20)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def workloads_markdown(results: dict) -> str:
    m = results["machine"]
    parts = [f"## Workload benchmarks ({results['mode']} mode)\n",
             f"Run {results['date']} with `{results['command']}` (seed {results['seed']}) on "
             f"{m['cpus']} CPUs ({m['cpu']}), Python {m['python']}; "
             f"total {results.get('elapsed_s') or '-'} s. "
             + (results.get("note") or "Every figure below comes from this one run, "
                "systems side by side on the same prompts.") + "\n"]
    if results.get("http") or results.get("transformers"):
        parts += ["### Ratios (side by side)\n", ratio_table(results),
                  "### Per workload (HTTP, streaming; transformers/llama.cpp in-process, "
                  "sequential)\n", http_tables(results)]
        if results.get("sample"):
            parts.append(f"Cache off and transformers ran {results['sample']} requests of each "
                         "workload, spread evenly over its arrival order (early and late turns "
                         "alike); their ratios compare them with cache on's figures for the "
                         "same requests (CPU: cache on's mean over the workload).\n")
        errors = {v: r["error"][-300:] for v, r in (results.get("http") or {}).items()
                  if r.get("error")}
        if errors:
            parts.append("Server variants that failed to start: " + "; ".join(
                f"`{v}`: {e!r}" for v, e in errors.items()) + "\n")
    goals = results["sweep"]["goals"]
    parts += [f"### Memory-pressure sweep (KV manager replay, no model; {results['sweep']['mode']}"
              "-size traces)\n",
              "Hit rate (prompt tokens reused) vs KV budget as a share of each workload's "
              "working set; plot `sweep.png`.\n", sweep_markdown(_sweeps(results)),
              "\nGoal checks: " + ", ".join(f"{k}: " + ", ".join(
                  f"{w}={'yes' if ok else 'NO'}" for w, ok in v.items())
                  for k, v in goals.items()) + "\n"]
    scripts = {k: v for k, v in (results.get("scripts") or {}).items() if v}
    if scripts:
        parts.append("### Other benchmark scripts\n")
        parts += [f"- `{k}`: " + (f"FAILED: {v['error']}" if v.get("error") else
                                  f"exit {v.get('returncode')}, log `{v.get('log', '-')}`")
                  for k, v in scripts.items()]
    return "\n".join(parts) + "\n"


def write_all(results: dict, out_dir: Path) -> None:
    if systems(results):
        plot_http(results, out_dir / "http.png")
    (out_dir / "workloads.md").write_text(workloads_markdown(results))
