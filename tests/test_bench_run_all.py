"""End to end: run_all against real ``radixgate serve --tiny`` subprocesses (slow)."""
import json

import pytest

from benchmarks.run_all import run, run_other_script


@pytest.mark.slow
def test_run_all_with_tiny_servers_compares_cache_on_and_off(tmp_path):
    results = run(["--quick", "--tiny", "--workloads", "shared_system,control",
                   "--variants", "radixgate,cache_off", "--no-transformers", "--no-scripts",
                   "--sweep-quick", "--out", str(tmp_path)])
    on = results["http"]["radixgate"]["workloads"]
    off = results["http"]["cache_off"]["workloads"]
    bound = results["upper_bound"]
    assert results["http"]["radixgate"]["warm_up"]["ok"]      # unmeasured, then flushed
    for name in ("shared_system", "control"):
        assert on[name]["errors"] == off[name]["errors"] == 0
        # the server renders exactly the tokens the traces predict
        assert on[name]["prompt_tokens"] == bound[name]["prompt_tokens"]
        # cache off ran the default sample of 4, the same requests as cache on's
        sample = [on[name]["results"][i] for i in off[name]["sample_indices"]]
        assert off[name]["requests"] == len(sample) == 4
        assert off[name]["prompt_tokens"] == sum(r["prompt_tokens"] for r in sample)
        assert off[name]["hit_rate"] == 0.0
        # every reply the cache-on server generated was recorded for the bound
        assert bound[name]["replies"] == on[name]["requests"]
    assert on["shared_system"]["hit_rate"] == pytest.approx(bound["shared_system"]["hit_rate"],
                                                            abs=0.02)
    assert on["shared_system"]["hit_rate"] > 0.5 > on["control"]["hit_rate"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["http"]["radixgate"]["workloads"]["control"]["requests"] == 6
    assert (tmp_path / "sweep.png").exists() and (tmp_path / "http.png").exists()
    assert "radixgate --no-prefix-cache, 4 requests" in (tmp_path / "workloads.md").read_text()


def test_other_scripts_write_their_json_into_the_runs_folder(tmp_path):
    record = run_other_script("radix_ops", True, tmp_path, timeout_s=120)
    assert record["returncode"] == 0 and record["flags"] == ["--quick", "--out", str(tmp_path)]
    saved = json.loads((tmp_path / "radix_ops.json").read_text())
    assert saved["partial_list"]["match_plus_insert"]["median_us"] > 0
    assert "written " + str(tmp_path / "radix_ops.json") in (tmp_path / "radix_ops.log").read_text()
