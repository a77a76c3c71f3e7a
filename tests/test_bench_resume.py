"""``run_all --resume``: an interrupted run continues with only what it had not finished."""
import json

import pytest

from benchmarks import run_all
from benchmarks.resume import (ResumeMismatch, finished_parts, load_previous, pending,
                               runs_note, save_atomically)

BASE = ["--quick", "--no-scripts", "--sweep-quick", "--no-transformers",
        "--workloads", "shared_system,control", "--variants", "radixgate,cache_off"]


class Interrupted(Exception):
    pass


def fake_variants(calls: list, fail_at: tuple | None = None):
    """A stand-in for ``run_variant`` that records (variant, workload) and can stop at one."""
    def run_variant(variant, workloads, args, out, save=lambda: None):
        for w in workloads:
            if (variant, w.name) == fail_at:
                raise Interrupted
            calls.append((variant, w.name))
            out["workloads"][w.name] = {"requests": len(w.requests), "errors": 0}
            save()
    return run_variant


def test_resume_runs_only_the_pairs_an_interrupted_run_left(tmp_path, monkeypatch):
    calls: list = []
    args = BASE + ["--out", str(tmp_path)]
    monkeypatch.setattr(run_all, "run_variant", fake_variants(calls, ("cache_off", "control")))
    with pytest.raises(Interrupted):
        run_all.run(args)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["http"]["cache_off"]["workloads"]) == {"shared_system"}
    assert calls == [("radixgate", "shared_system"), ("radixgate", "control"),
                     ("cache_off", "shared_system")]
    sweep_before = saved["sweep"]

    calls.clear()
    monkeypatch.setattr(run_all, "run_variant", fake_variants(calls))
    results = run_all.run(args + ["--resume"])
    assert calls == [("cache_off", "control")]
    assert results["sweep"] == sweep_before              # not swept again
    assert len(results["runs"]) == 2
    assert results["elapsed_s"] == pytest.approx(sum(r["elapsed_s"] for r in results["runs"]),
                                                 abs=0.11)
    assert "2 invocations" in (tmp_path / "workloads.md").read_text()

    calls.clear()
    run_all.run(args + ["--resume"])                     # nothing left: no server started
    assert calls == []


def test_resume_runs_again_a_pair_whose_requests_failed(tmp_path, monkeypatch):
    calls: list = []

    def server_died_in_control(variant, workloads, args, out, save=lambda: None):
        for w in workloads:
            calls.append((variant, w.name))
            out["workloads"][w.name] = {"requests": len(w.requests),
                                        "errors": 3 if w.name == "control" else 0}
            save()
    args = BASE + ["--out", str(tmp_path), "--variants", "radixgate"]
    monkeypatch.setattr(run_all, "run_variant", server_died_in_control)
    run_all.run(args)
    calls.clear()
    monkeypatch.setattr(run_all, "run_variant", fake_variants(calls))
    results = run_all.run(args + ["--resume"])
    assert calls == [("radixgate", "control")]
    assert results["http"]["radixgate"]["workloads"]["control"]["errors"] == 0


def test_without_resume_a_run_starts_over(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(run_all, "run_variant", fake_variants(calls))
    run_all.run(BASE + ["--out", str(tmp_path)])
    calls.clear()
    results = run_all.run(BASE + ["--out", str(tmp_path)])
    assert len(calls) == 4 and len(results["runs"]) == 1


def test_resume_with_other_settings_is_refused_with_the_difference(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_all, "run_variant", fake_variants([]))
    run_all.run(BASE + ["--out", str(tmp_path)])
    code = run_all.main(BASE + ["--out", str(tmp_path), "--resume", "--seed", "3"])
    assert code == 2
    assert "seed: saved 0, now 3" in capsys.readouterr().err


def test_load_previous_rejects_files_it_cannot_continue(tmp_path):
    settings = {"mode": "full", "seed": 0}
    assert load_previous(tmp_path, settings) is None
    (tmp_path / "results.json").write_text("{\"http\": {")
    with pytest.raises(ResumeMismatch, match="not valid JSON"):
        load_previous(tmp_path, settings)
    (tmp_path / "results.json").write_text("[1, 2]")
    with pytest.raises(ResumeMismatch, match="not a run_all result"):
        load_previous(tmp_path, settings)
    (tmp_path / "results.json").write_text(json.dumps({"http": {}}))
    with pytest.raises(ResumeMismatch, match="no recorded settings"):
        load_previous(tmp_path, settings)
    save_atomically({"settings": settings, "http": {"a": 1}}, tmp_path)
    assert load_previous(tmp_path, settings)["http"] == {"a": 1}
    assert not list(tmp_path.glob("*.partial"))


def test_finished_parts_lists_what_a_resumed_run_skips():
    results = {"sweep": {}, "http": {"radixgate": {"workloads": {"a": {"errors": 0},
                                                                 "b": {"errors": 2}}}},
               "transformers": {"workloads": {"a": {"errors": 0}}},
               "scripts": {"radix_ops": {"returncode": 0}, "kernels_bench": {"returncode": 1},
                           "seed_spread": None}}
    assert finished_parts(results) == ["sweep", "radixgate/a", "transformers/a",
                                       "script radix_ops"]
    assert finished_parts({"http": {}}) == []


def test_pending_and_runs_note():
    class W:
        def __init__(self, name):
            self.name = name
    assert [w.name for w in pending([W("a"), W("b")], {"a": {}})] == ["b"]
    assert [w.name for w in pending([W("a"), W("b")], {"a": {"errors": 1}, "b": {"errors": 0}})] == ["a"]
    one = {"runs": [{"date": "d1", "elapsed_s": 3, "commit": "abc"}]}
    assert runs_note(one) == ""
    two = {"runs": one["runs"] + [{"date": "d2", "elapsed_s": 4, "commit": "def"}]}
    note = runs_note(two)
    assert "2 invocations" in note and "d2 for 4 s" in note and "commits abc, def" in note
    assert "except" not in note
    two["http"] = {"cache_off": {"workloads": {"agents": {"resumed": {"segments": 2}},
                                               "control": {}}}}
    assert "except these cache-off pairs" in runs_note(two)
    assert "cache_off/agents (2)" in runs_note(two) and "control" not in runs_note(two)


@pytest.mark.slow
def test_transformers_baseline_adds_to_saved_summaries_and_reports_each_workload():
    from benchmarks.peers import transformers_baseline
    from benchmarks.traces import load_tokenizer, workload_trace
    from benchmarks.workloads import make_workloads
    workloads = make_workloads(quick=True, seed=0, names=("control",))
    traces = {w.name: workload_trace(w, load_tokenizer()) for w in workloads}
    saved, calls = {"workloads": {"shared_system": {"requests": 12}}}, []
    out = transformers_baseline(workloads, traces, None, 1, out=saved,
                                on_workload=lambda: calls.append(1))
    assert out is saved and calls == [1]
    assert out["workloads"]["shared_system"] == {"requests": 12}
    assert out["workloads"]["control"]["requests"] == 1
    assert out["workloads"]["control"]["errors"] == 0


def test_full_runs_default_to_their_own_folder_so_a_quick_run_cannot_overwrite_them():
    from pathlib import Path
    assert run_all.parse_args(["--full"]).out == Path("benchmarks/out/full")
    assert run_all.parse_args([]).out == Path("benchmarks/out")
    assert run_all.parse_args(["--full", "--out", "x"]).out == Path("x")


class FakeLlama:
    """Stands in for ``llama_cpp.Llama``: streams one chunk per token, then a final one."""

    def __init__(self, **kwargs):
        pass

    def set_cache(self, cache):
        pass

    def create_completion(self, prompt, max_tokens, temperature, stream):
        for _ in range(max_tokens):
            yield {"choices": [{"finish_reason": None}]}
        yield {"choices": [{"finish_reason": "length"}]}


def test_llama_cpp_runs_only_the_workloads_it_has_no_summary_for(monkeypatch):
    import sys
    import types

    from benchmarks.traces import load_tokenizer, workload_trace
    from benchmarks.workloads import make_workloads
    fake = types.ModuleType("llama_cpp")
    fake.Llama, fake.LlamaRAMCache = FakeLlama, lambda capacity_bytes: None
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    workloads = make_workloads(quick=True, seed=0, names=("shared_system", "control"))
    traces = {w.name: workload_trace(w, load_tokenizer()) for w in workloads}
    results, saves = {"llama_cpp": {"workloads": {"shared_system": {"requests": 12}}}}, []
    run_all.run_llama_cpp(results, workloads, traces, lambda: saves.append(1))
    done = results["llama_cpp"]["workloads"]
    assert done["shared_system"] == {"requests": 12}                  # kept, not rerun
    assert done["control"]["requests"] == len(workloads[1].requests)
    assert done["control"]["errors"] == 0 and done["control"]["hit_rate"] is None
    assert len(saves) == 2                                            # after the workload, at the end
