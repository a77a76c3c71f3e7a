"""The long-context rows of the side-by-side benchmark (``peer_speed --long``) at their tiny
size, radixgate only: one cold prompt per context, every requested token streamed, nothing
read from the cache, the roofline the documented product. No timing assertions."""
from __future__ import annotations

import pytest

from benchmarks.peer_long import (LONG_SIZES, add_long_roofline, long_markdown, long_summary,
                                  run_long_benchmark)
from benchmarks.peer_speed import LLAMA, RADIXGATE

TINY = LONG_SIZES["tiny"]


@pytest.fixture(scope="module")
def report() -> dict:
    return run_long_benchmark("tiny", None, deterministic_row=False, log=lambda _: None)


def test_each_context_is_a_cold_prompt_of_its_length_and_streams_every_token(report):
    (rows,) = report["runs"][RADIXGATE]
    assert [row["context"] for row in rows] == list(TINY.contexts)
    assert all(row["completion_tokens"] == TINY.decode_tokens for row in rows)
    assert all(row["cached_tokens"] == 0 for row in rows)          # each prompt its own nonce
    assert all(row["ttft_s"] > 0 and row["decode_tok_s"] > 0 for row in rows)


def test_roofline_counts_the_weights_and_the_mean_contexts_kv(report):
    (rows,) = report["runs"][RADIXGATE]
    row = rows[-1]
    per_token = report["weight_bytes"][RADIXGATE] + \
        (row["context"] + TINY.decode_tokens / 2) * report["kv_bytes_per_token"][RADIXGATE]
    expected = row["decode_tok_s"] * per_token / (max(report["copy_bandwidth_gbs"]) * 1e9)
    assert row["decode_roofline"] == pytest.approx(expected, rel=1e-2, abs=1e-4)
    assert "decode_roofline" in long_markdown(report)


def test_ratios_to_the_peer_pair_repetitions_per_context():
    runs = {LLAMA: [[{"context": 8, "decode_tok_s": 10.0}], [{"context": 8, "decode_tok_s": 20.0}]],
            RADIXGATE: [[{"context": 8, "decode_tok_s": 5.0}], [{"context": 8, "decode_tok_s": 30.0}]]}
    for reps in runs.values():
        for rows in reps:
            add_long_roofline(rows, 100, 10, 1.0, 4)
            rows[0]["ttft_s"] = 1.0
    (entry,) = long_summary(runs)
    assert entry["decode_tok_s"] == {LLAMA: [10.0, 20.0], RADIXGATE: [5.0, 30.0]}
    assert entry["decode_tok_s_ratio"] == {RADIXGATE: [0.5, 1.5]}
    assert entry["decode_roofline"][RADIXGATE] == [round(5.0 * 200 / 1e9, 4), round(30.0 * 200 / 1e9, 4)]
