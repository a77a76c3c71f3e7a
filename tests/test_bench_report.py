"""The benchmark report: ratio and per-workload tables, plots, from one results dict."""
from dataclasses import asdict

from benchmarks import report
from benchmarks.memory_sweep import goal_checks, sweep_trace
from benchmarks.replies import prompt_key
from benchmarks.run_all import failures, parse_args, upper_bounds
from benchmarks.summary import spread_sample, summarize
from benchmarks.traces import TraceEntry


def request(prompt: int, read: int, ttft_s: float) -> dict:
    return {"ok": True, "prompt_tokens": prompt, "cache_read_tokens": read, "output_tokens": 8,
            "ttft_s": ttft_s, "itl_s": 0.02}


def results_dict() -> dict:
    shared = list(range(100, 164))
    entries = [TraceEntry("n", tuple(shared + [i, i + 1]), f"s{i}") for i in range(6)]
    sweep = sweep_trace("tiny", [(e.namespace, e.tokens) for e in entries], 16, (0.5, 1.0))
    on = {**summarize([request(66, 64, 0.05)] * 5 + [request(66, 0, 0.2)], 2.0), "cpu_s": 1.0}
    off = {**summarize([request(66, 0, 0.2)] * 6, 4.0), "cpu_s": 3.0}
    return {"date": "2026-11-29 14:00 UTC", "command": "python -m benchmarks.run_all --quick",
            "mode": "quick", "seed": 0, "machine": report.machine_info(), "elapsed_s": 1.0,
            "sweep": {"mode": "full", "workloads": [asdict(sweep)], "goals": goal_checks([sweep])},
            "upper_bound": upper_bounds({"tiny": entries}),
            "http": {"radixgate": {"workloads": {"tiny": on}},
                     "cache_off": {"workloads": {"tiny": off}},
                     "page_rounded": {"error": "server exited with 2", "workloads": {}}},
            "transformers": {"load_s": 1.0, "workloads": {"tiny": off}}}


def test_upper_bound_reuses_every_shared_prefix_token():
    ub = upper_bounds({"tiny": [TraceEntry("n", (1, 2, 3, 4), "a"),
                                TraceEntry("n", (1, 2, 3, 9), "b"),
                                TraceEntry("m", (1, 2, 3, 4), "c")]})["tiny"]
    assert (ub["prompt_tokens"], ub["cache_read_tokens"], ub["prefill_tokens"]) == (12, 3, 9)
    assert ub["replies"] == 0


def test_upper_bound_caches_each_reply_but_its_last_token_after_the_prompt():
    # the model answered (7, 8, 9); the next turn re-sends the prompt and a scripted
    # assistant turn that begins like that answer: 7, 8 are cached, 9 never was
    first, second = TraceEntry("n", (1, 2, 3), "a"), TraceEntry("n", (1, 2, 3, 7, 8, 9, 5), "a")
    prompt_only = upper_bounds({"t": [first, second]})["t"]
    with_reply = upper_bounds({"t": [first, second]}, {prompt_key(first.tokens): (7, 8, 9)})["t"]
    assert prompt_only["cache_read_tokens"] == 3
    assert (with_reply["cache_read_tokens"], with_reply["replies"]) == (5, 1)


def test_report_shows_side_by_side_ratios_and_failed_variants(tmp_path):
    results = results_dict()
    text = report.workloads_markdown(results)
    ratio_row = next(line for line in text.splitlines() if line.startswith("| tiny |"))
    assert "80.8% / - /" in ratio_row                 # hit rate on / page-rounded / bound
    assert "| - | 5.21x |" in ratio_row                # prefill page-rounded (failed), off / on
    assert "| 4.00x | 4.00x | 3.00x | 3.00x |" in ratio_row   # TTFT p50, CPU s per request
    assert "radixgate --no-prefix-cache" in text and "transformers generate" in text
    assert "`page_rounded`" in text                    # the variant that failed is reported
    assert results["command"] in text and "2026-11-29" in text
    report.write_all(results, tmp_path)
    assert (tmp_path / "http.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "workloads.md").read_text() == text


def test_ratios_are_withheld_when_a_side_lost_requests_and_failures_are_listed():
    results = results_dict()
    assert failures(results) == ["page_rounded: server exited with 2"]
    failed = {"ok": False, "prompt_tokens": 0, "cache_read_tokens": 0, "output_tokens": 0,
              "ttft_s": None, "itl_s": None, "error": "HTTP 529 overloaded"}
    off = {**summarize([request(66, 0, 0.2)] * 5 + [failed], 4.0), "cpu_s": 3.0}
    results["http"]["cache_off"]["workloads"]["tiny"] = off
    results["scripts"] = {"radix_ops": {"returncode": None, "error": "timed out after 300s"}}
    ratio_row = next(line for line in report.ratio_table(results).splitlines()
                     if line.startswith("| tiny |"))
    assert ratio_row.count("n/a (errors)") == 3         # prefill, TTFT, CPU vs off
    assert "| 4.00x |" in ratio_row                       # transformers / on still compared
    problems = failures(results)
    assert any(p.startswith("cache_off/tiny: 1 failed requests, e.g. HTTP 529") for p in problems)
    assert "script radix_ops: timed out after 300s" in problems
    assert "FAILED: timed out after 300s" in report.workloads_markdown(results)
    nothing = summarize([failed], 1.0)
    assert nothing["hit_rate"] is None and report.per_request(nothing, "prefill_tokens") is None


def test_ratios_against_a_sample_use_cache_on_figures_for_the_same_requests():
    results = results_dict()
    on_results = [request(66, 0, 0.4)] + [request(66, 64, 0.05)] * 4 + [request(66, 60, 0.1)]
    on = {**summarize(on_results, 2.0), "cpu_s": 1.2, "results": on_results}
    off = {**summarize([request(66, 0, 0.8), request(66, 0, 0.3)], 1.0), "cpu_s": 1.0,
           "sample_indices": [0, 5]}
    results["http"]["radixgate"]["workloads"]["tiny"] = on
    results["http"]["cache_off"]["workloads"]["tiny"] = off
    text = report.workloads_markdown(results)
    ratio_row = next(line for line in text.splitlines() if line.startswith("| tiny |"))
    # prefill 132 / 72 and TTFT p50 550 / 250 ms on requests 0 and 5; CPU 0.5 / 0.2 s
    assert "| 1.83x | 2.20x | 4.00x | 2.50x |" in ratio_row
    assert "| radixgate --no-prefix-cache, 2 requests | 132 |" in text


def test_spread_sample_takes_early_and_late_requests():
    assert spread_sample(list(range(10)), 4) == [0, 3, 6, 9]
    assert spread_sample(list(range(10)), 1) == [0]
    assert spread_sample(list(range(3)), 8) == [0, 1, 2]
    assert spread_sample(list(range(3)), None) == [0, 1, 2]


def test_quick_is_the_default_mode_and_kv_budget_follows_it():
    quick, full = parse_args([]), parse_args(["--full"])
    assert quick.quick and not full.quick
    assert quick.kv_cache_gb < full.kv_cache_gb


def test_max_tokens_override_changes_output_length_only():
    from benchmarks.run_all import set_max_tokens
    from benchmarks.workloads import make_workloads
    before = make_workloads(quick=True, seed=0, names=("agents", "doc_qa"))
    after = make_workloads(quick=True, seed=0, names=("agents", "doc_qa"))
    set_max_tokens(after, 3)
    for old, new in zip(before, after):
        assert [r.max_tokens for r in new.requests] == [3] * len(old.requests)
        assert [r.messages for r in new.requests] == [r.messages for r in old.requests]
    args = parse_args(["--variants", "radixgate,plain_lru", "--kv-cache-gb", "0.5",
                       "--max-tokens", "8"])
    assert (args.variants, args.kv_cache_gb, args.max_tokens) == ("radixgate,plain_lru", 0.5, 8)
    assert parse_args([]).variants == "radixgate,cache_off,page_rounded"
