"""The speculative decoding benchmark's arithmetic (benchmarks/spec_bench.py): the copied
share, the ratios and the best peer mode; its tiny end-to-end run is under ``-m slow``."""
from __future__ import annotations

import pytest

from benchmarks.spec_bench import copied_share, markdown, run_benchmark, summarize


def test_copied_share_counts_answer_tokens_whose_4gram_is_in_the_prompt():
    prompt = [1, 2, 3, 4, 5, 6, 7]
    assert copied_share(prompt, [2, 3, 4, 5, 6]) == pytest.approx(2 / 5)  # (2..5), (3..6)
    assert copied_share(prompt, [9, 9, 9, 9]) == 0.0
    assert copied_share([1, 2, 3, 4, 1, 2, 3], [4, 1, 2, 3]) == 1.0    # it goes on copying


def _runs(on, off, peers):
    def figures(value):
        return {w: {"tok_s": value} for w in ("code_edit", "tool_call", "agent_turns", "control",
                                              "streams")}
    runs = {"radixgate_none": figures(off), "radixgate_ngram": figures(on)}
    runs.update({name: figures(v) for name, v in peers.items()})
    return runs


def test_ratios_take_spec_off_and_the_best_llama_ngram_mode():
    runs = _runs(30.0, 10.0, {"llama_none": 50.0, "llama_ngram_simple": 20.0,
                              "llama_ngram_mod": 25.0})
    entry = summarize(runs)["code_edit"]
    assert entry == {"spec_on_over_off": 3.0, "llama_best": "llama_ngram_mod",
                     "llama_best_tok_s": 25.0, "spec_on_over_llama_best": 1.2}
    report = {"runs": runs, "summary": summarize(runs), "code_edit_copied_share": 0.9,
              "machine": "m"}
    assert "| code_edit | 10 | 30 | 50 | 20 | 25 | 3.0x | 1.2x (llama_ngram_mod) |" in markdown(report)


@pytest.mark.slow
def test_tiny_run_reports_every_workload_for_both_modes():
    report = run_benchmark("tiny", None, log=lambda _: None)
    assert set(report["runs"]) == {"radixgate_none", "radixgate_ngram"}
    assert report["runs"]["radixgate_ngram"]["spec_counts"]["verify_steps"] > 0
    assert 0.0 <= report["code_edit_copied_share"] <= 1.0


def test_the_agent_conversation_asks_for_what_its_earlier_turns_hold():
    from benchmarks.spec_bench import SIZES, agent_conversation
    from benchmarks.traces import load_tokenizer
    tokenizer = load_tokenizer()
    text = tokenizer.decode(agent_conversation(tokenizer, SIZES["default"]))
    assert text.count("def update_record_1(") == 1 and '"id": "cus_4101"' in text
    assert text.rstrip().endswith("# ") or text.endswith("# ")
    assert text.count("<|im_start|>user") == 3 and text.count("<|im_start|>assistant") >= 2
