"""Resuming an interrupted ``run_all`` (``--resume``): a full-size run takes hours, so every
finished part is saved as it ends and a rerun with the same settings does only what is
missing.

A part is one (server variant, workload) pair, one transformers or llama.cpp workload, one
other script, or the sweep; a part whose requests failed is done again. A pair on a
server variant without a cache is also saved request by request (``benchmarks.checkpoint``),
so a kill there loses only the requests in flight. ``results.json`` is rewritten
atomically after each part, so a run that is killed loses at most the part it was in. Each
invocation appends its date, commit and time to ``results["runs"]``; the report says when
a run's figures came from several.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Iterable


class ResumeMismatch(ValueError):
    """The saved results were made with settings that differ from this run's."""


def run_settings(args) -> dict:
    """What must be equal for saved figures to belong to the same run."""
    return {"mode": "quick" if args.quick else "full", "seed": args.seed,
            "concurrency": args.concurrency, "kv_cache_gb": args.kv_cache_gb,
            "max_tokens": args.max_tokens, "cache_control": args.cache_control,
            "tiny": args.tiny, "transformers_requests": args.transformers_requests,
            "sweep_quick": bool(args.sweep_quick and args.quick)}


def load_previous(out_dir: Path, settings: dict) -> dict | None:
    """The saved results to continue, None when there are none; raises ``ResumeMismatch``
    (naming each differing setting) when they were made with other settings."""
    path = out_dir / "results.json"
    if not path.exists():
        return None
    try:
        previous = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ResumeMismatch(f"{path} is not valid JSON ({e}); move it away to start over")
    if not isinstance(previous, dict):
        raise ResumeMismatch(f"{path} is not a run_all result; move it away to start over")
    saved = previous.get("settings")
    if saved is None:
        raise ResumeMismatch(f"{path} has no recorded settings (made before --resume "
                             "existed); move it away to start over")
    saved = {k: saved.get(k, previous.get(k)) for k in settings}   # older files: top level
    differ = [f"{k}: saved {saved[k]!r}, now {v!r}" for k, v in settings.items()
              if saved[k] != v]
    if differ:
        raise ResumeMismatch(f"{path} was made with other settings ({'; '.join(differ)}); "
                             "rerun with those settings, or use another --out")
    return previous


def pending(workloads: Iterable, done: dict) -> list:
    """The workloads without a saved summary in ``done`` (name -> summary), or whose saved
    summary counts failed requests (a server that died mid-way): those run again."""
    return [w for w in workloads if w.name not in done or done[w.name].get("errors")]


def open_part(records: dict, key: str, workloads: Iterable) -> tuple[dict, list]:
    """``records[key]`` (created when missing, its last error cleared) and the workloads it
    still lacks (``pending``): where a variant or baseline adds its summaries."""
    out = records.get(key) or {}
    records[key] = out
    out.pop("error", None)
    return out, pending(workloads, out.setdefault("workloads", {}))


def finished_parts(results: dict) -> list[str]:
    """``variant/workload`` (and ``transformers/...``, ``llama_cpp/...``, ``script ...``)
    for every part saved in ``results`` that a resumed run will not do again."""
    runs = {**(results.get("http") or {}), "transformers": results.get("transformers") or {},
            "llama_cpp": results.get("llama_cpp") or {}}
    parts = [f"{name}/{workload}" for name, run in runs.items()
             for workload, summary in (run.get("workloads") or {}).items()
             if not summary.get("errors")]
    parts += [f"script {name}" for name, script in (results.get("scripts") or {}).items()
              if (script or {}).get("returncode") == 0]
    return (["sweep"] if "sweep" in results else []) + parts


def save_atomically(results: dict, out_dir: Path) -> None:
    """Write ``results.json`` so that a kill mid-write leaves the previous file intact."""
    path = out_dir / "results.json"
    scratch = path.with_suffix(".json.partial")
    scratch.write_text(json.dumps(results, indent=1, default=str))
    os.replace(scratch, path)


def current_commit() -> str:
    """The checkout's commit (``-dirty`` with uncommitted changes), or '' outside git."""
    repo = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True, cwd=repo).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10,
                               cwd=repo).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return commit + ("-dirty" if dirty else "")


def runs_note(results: dict) -> str:
    """One sentence for the report when the figures come from more than one invocation."""
    runs = results.get("runs") or []
    if len(runs) < 2:
        return ""
    commits = sorted({r.get("commit") or "?" for r in runs})
    split = [f"{variant}/{name} ({s['resumed']['segments']})"
             for variant, run in (results.get("http") or {}).items()
             for name, s in (run.get("workloads") or {}).items() if s.get("resumed")]
    return (f"The figures come from {len(runs)} invocations, each resuming the last "
            "(`--resume`): " + "; ".join(f"{r['date']} for {r.get('elapsed_s', '-')} s"
                                        for r in runs)
            + f" (commit{'s' if len(commits) > 1 else ''} {', '.join(commits)}). Each "
            "(variant, workload) pair ran whole within one of them"
            + (f", except these cache-off pairs, whose requests were saved one by one and "
               f"answered over several (in brackets, how many invocations answered some; a "
               f"server without a cache keeps nothing between requests): {', '.join(split)}"
               if split else "")
            + "; an invocation starts its servers afresh, so the first pair it runs on each "
            "also pays the cold start.")
