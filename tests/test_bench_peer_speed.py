"""The side-by-side benchmark against llama-server at its tiny size, radixgate only
(the peer skipped): the report has its documented shape and its numbers add up. No timing
assertions: the speeds and ratios are the benchmark's output, not a pass/fail criterion."""
from __future__ import annotations

import os

import pytest

from benchmarks.peer_speed import (LLAMA, METRICS, RADIXGATE, RADIXGATE_DET, SIZES,
                                   gguf_bytes_per_token, markdown, run_benchmark, summarize)
from benchmarks.traces import default_gguf_path

TINY = SIZES["tiny"]


@pytest.fixture(scope="module")
def report() -> dict:
    return run_benchmark("tiny", llama_binary=None, default_budget=False, log=lambda _: None,
                         deterministic_row=False)


def test_peer_skipped_with_a_note_and_no_ratios(report):
    assert "llama-server not built" in report["peer"]["skipped"]
    assert list(report["runs"]) == [RADIXGATE]
    assert set(report["summary"]) == set(METRICS)
    assert all(set(entry) == {RADIXGATE} for entry in report["summary"].values())


def test_run_counts_every_requested_token(report):
    (run,) = report["runs"][RADIXGATE]
    assert run["single_stream_tokens"] == TINY.decode_tokens
    assert (run["streams"], run["streams_tokens"]) == (TINY.streams,
                                                      TINY.streams * TINY.stream_tokens)
    assert run["streams_tok_s"] == pytest.approx(run["streams_tokens"] / run["streams_wall_s"],
                                                 rel=1e-2)
    assert run["cold_prefill_tokens"] == TINY.prefill_tokens
    assert run["cached_prefix_prompt_tokens"] == TINY.prefill_tokens + TINY.suffix_tokens
    assert run["cached_prefix_cached_tokens"] == TINY.prefill_tokens     # token-exact reuse
    assert (run["users"], run["users_tokens"]) == (TINY.users,
                                                  TINY.users * TINY.user_answer_tokens)
    assert run["users_cached_tokens"] <= (TINY.users - 1) * (TINY.system_tokens + 1)


def test_kv_budget_holds_the_peer_context_exactly(report):
    (run,) = report["runs"][RADIXGATE]
    assert run["capacity_tokens"] == TINY.context_tokens
    assert 0 < run["rss_light_mb"] <= run["peak_rss_mb"]


def test_roofline_is_rate_times_bytes_over_bandwidth(report):
    (run,) = report["runs"][RADIXGATE]
    expected = (run["single_stream_tok_s"] * report["bytes_per_token"][RADIXGATE]
                / (max(report["copy_bandwidth_gbs"]) * 1e9))
    assert run["single_stream_roofline"] == pytest.approx(expected, rel=1e-2, abs=1e-4)
    assert len(report["copy_bandwidth_gbs"]) == 2 and min(report["copy_bandwidth_gbs"]) > 0
    assert "single_stream_roofline" in markdown(report)


def test_ratios_pair_repetitions_side_by_side():
    runs = {LLAMA: [dict.fromkeys(METRICS, 2.0), dict.fromkeys(METRICS, 4.0)],
            RADIXGATE: [dict.fromkeys(METRICS, 1.0), dict.fromkeys(METRICS, 6.0)]}
    summary = summarize(runs)
    assert summary["streams_tok_s"] == {LLAMA: [2.0, 4.0], RADIXGATE: [1.0, 6.0],
                                        "ratio": [0.5, 1.5]}


def test_deterministic_row_has_its_ratios_to_the_peer_and_to_the_default_mode():
    runs = {LLAMA: [dict.fromkeys(METRICS, 2.0)], RADIXGATE: [dict.fromkeys(METRICS, 1.0)],
            RADIXGATE_DET: [dict.fromkeys(METRICS, 0.9)]}
    entry = summarize(runs)["cold_prefill_ttft_s"]
    assert entry["ratio_deterministic"] == [0.45] and entry["deterministic_cost"] == [0.9]
    report = {"runs": runs, "summary": summarize(runs), "machine": "m",
              "copy_bandwidth_gbs": [1.0], "bytes_per_token": {}, "peer": {},
              "radixgate_default_budget": None}
    assert "| deterministic / no-deterministic |" in markdown(report).splitlines()[0]


def test_gguf_bytes_per_token_counts_the_tied_embedding_as_read():
    size = os.path.getsize(default_gguf_path())
    assert 0.95 * size < gguf_bytes_per_token(default_gguf_path()) < size
