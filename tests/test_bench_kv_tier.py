"""benchmarks/kv_tier_bench.py on a small trace: the working set count, and a replay at a
small memory budget where the disk tier brings the hit rate back to unlimited memory's."""
from __future__ import annotations

from benchmarks import kv_tier_bench
from tests.support.engine import tiny_model


def test_the_tier_restores_the_unlimited_hit_rate_on_a_small_conversation_trace(tmp_path):
    trace = kv_tier_bench.conversation_trace(quick=True)[:24]
    working = kv_tier_bench.working_set_blocks(trace)
    longest = max(-(-len(t) // kv_tier_bench.BLOCK) for _, t in trace) + 2
    assert longest < working < sum(-(-len(t) // 16) for _, t in trace)
    loaded = tiny_model()
    unlimited = kv_tier_bench.replay(loaded, trace, working + longest, None, 0)
    small = max(working // 10, longest)
    memory_only = kv_tier_bench.replay(loaded, trace, small, None, 0)
    with_tier = kv_tier_bench.replay(loaded, trace, small, str(tmp_path), 0.05)
    assert memory_only["hit_rate"] < unlimited["hit_rate"]
    assert with_tier["hit_rate"] >= 0.95 * unlimited["hit_rate"]
    assert with_tier["disk_hit_tokens"] > 0 and with_tier["writes"] > 0
