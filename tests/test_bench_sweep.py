"""Smoke tests of the memory sweep: Belady simulator vs the real RadixTree, on tiny traces."""
import json
import math
import random

import pytest

from benchmarks.belady import BeladyCache, FutureOracle
from benchmarks.memory_sweep import (compare_policies, goal_checks, markdown, plot, replay_belady,
                                     replay_manager, replay_radix, serve, sweep_trace)
from benchmarks.traces import load_tokenizer, workload_trace
from benchmarks.workloads import make_workloads

B = 16


def random_trace(seed: int, n: int = 40) -> list[tuple[str, list[int]]]:
    """Prompts = one of a few shared prefixes (varied lengths, not block aligned) + a tail."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randint(5, 90))] for _ in range(5)]
    trace = []
    for _ in range(n):
        base = rng.choice(prefixes)
        cut = rng.randint(1, len(base))
        tail = [rng.randrange(1000) for _ in range(rng.randint(1, 40))]
        trace.append((rng.choice("ab"), base[:cut] + tail))
    return trace


@pytest.fixture(scope="module")
def quick_traces():
    tokenizer = load_tokenizer()
    return {w.name: [(e.namespace, e.tokens) for e in workload_trace(w, tokenizer)]
            for w in make_workloads(quick=True, seed=0, names=("shared_system", "doc_qa",
                                                                 "control"))}


@pytest.mark.parametrize("round_to_block", [False, True])
def test_the_replay_admits_and_releases_through_the_kv_manager(round_to_block):
    """Each request goes through the engine's KVManager (admit with its match, grow to what
    is kept, release into the tree): the manager counts the reuse, the blocks come back."""
    manager = replay_manager(64, B, round_to_block=round_to_block)
    prompt = list(range(100, 140))                              # 2 blocks and 8 tokens
    assert serve(manager, 0, "ns", prompt, prompt + [7, 8]) == 0
    reused = serve(manager, 1, "ns", prompt + [9], prompt + [9])
    assert reused == (32 if round_to_block else 40)
    assert manager.hit_tokens["memory"] == reused
    manager.tree.check_integrity()
    assert manager.pool.num_free() == 64 - manager.tree.stats().cached_blocks


@pytest.mark.parametrize("seed", range(4))
def test_belady_simulator_counts_blocks_like_radix_tree_with_unlimited_memory(seed):
    trace = random_trace(seed)
    real = replay_radix(trace, B, None)
    sim = replay_belady(trace, B, None)
    assert (sim.reused_tokens, sim.peak_blocks) == (real.reused_tokens, real.peak_blocks)
    rounded = replay_radix(trace, B, None, round_to_block=True)
    assert rounded.reused_tokens == replay_belady(trace, B, None, True).reused_tokens


@pytest.mark.parametrize("seed", range(6))
def test_simulator_in_lru_mode_reproduces_radix_tree_hits_under_pressure(seed):
    """Same memory model and order; the two break ties between leaves touched in the same
    tick differently (the tree by heap push order: a trimmed leaf goes back behind its
    equals), so a few tokens may differ: at most 0.5% of the prompt tokens (0.17% seen)."""
    trace = random_trace(seed, n=60)
    for budget in (6, 15, 40):
        real = replay_radix(trace, B, budget, policy="lru")
        sim = replay_belady(trace, B, budget, policy="lru", trim_tails=True)
        assert abs(sim.reused_tokens - real.reused_tokens) <= 0.005 * real.prompt_tokens
        assert sim.peak_blocks <= budget + max(-(-len(t) // B) for _, t in trace)


def test_simulator_rejects_unknown_policy():
    with pytest.raises(ValueError):
        BeladyCache([("n", [1, 2])], B, policy="fifo")


def test_belady_keeps_the_prefix_needed_next_where_lru_drops_it():
    a, b = list(range(100, 164)), list(range(200, 264))       # 4 blocks each
    trace = [("n", a + [1]), ("n", b + [2]), ("n", a + [3])]
    lru = replay_radix(trace, B, budget_blocks=5, policy="lru")
    belady = replay_belady(trace, B, budget_blocks=5)
    assert lru.reused_tokens == 0
    assert belady.reused_tokens == 64


def test_future_oracle_finds_next_request_sharing_a_prefix():
    trace = [("n", [1, 2, 3]), ("n", [1, 2, 9]), ("n", [5]), ("n", [1, 2, 3, 4]), ("m", [1])]
    oracle = FutureOracle(trace)
    assert oracle.next_use(0, 2, now=0) == 1          # [1, 2] shared by request 1
    assert oracle.next_use(0, 3, now=0) == 3          # [1, 2, 3] next seen at request 3
    assert oracle.next_use(0, 3, now=3) == math.inf
    assert oracle.next_use(2, 1, now=0) == 2
    assert oracle.next_use(4, 1, now=0) == 4          # namespaces are separate tries


def test_belady_cache_never_holds_more_than_budget_after_eviction():
    trace = random_trace(9)
    cache = BeladyCache(trace, B)
    for i, (ns, _) in enumerate(trace):
        cache.serve(ns, i)
        cache.evict_to(12, now=i)
        assert cache.used_blocks <= 12


@pytest.mark.parametrize("seed", range(3))
def test_page_rounded_cache_reuses_less_and_holds_no_partial_block(seed):
    """With unlimited memory a hash-block cache reuses no more than token-exact matching
    and holds no more blocks (it never caches a prompt's partial last block). Under memory
    pressure that saving can let it keep more: the sweep measures it, nothing is assumed."""
    trace = random_trace(seed, n=60)
    exact = replay_radix(trace, B, None)
    rounded = replay_radix(trace, B, None, round_to_block=True)
    assert rounded.reused_tokens <= exact.reused_tokens
    assert rounded.peak_blocks <= exact.peak_blocks
    whole_blocks = sum(len(t) // B for _, t in trace)
    assert rounded.peak_blocks <= whole_blocks


def test_sweep_orders_hit_rates_by_sharing_and_meets_upper_bound_at_full_budget(quick_traces):
    sweeps = {name: sweep_trace(name, trace, B, fractions=(0.25, 1.0))
              for name, trace in quick_traces.items()}
    assert sweeps["shared_system"].upper_bound > sweeps["doc_qa"].upper_bound > 0.3
    assert sweeps["control"].upper_bound < 0.05
    for s in sweeps.values():
        full = s.points[-1]
        assert full.radixgate == pytest.approx(s.upper_bound)
        assert full.plain_lru == pytest.approx(s.upper_bound)
        assert full.belady == pytest.approx(s.upper_bound)
        assert full.page_rounded == pytest.approx(s.page_rounded_upper_bound)
        for p in s.points:
            assert max(p.radixgate, p.plain_lru, p.belady, p.page_rounded) <= s.upper_bound + 1e-9
            assert p.page_rounded <= p.radixgate


def test_sweep_outputs_table_plot_and_goal_checks(tmp_path):
    trace = random_trace(1)
    s = sweep_trace("tiny", trace, B, fractions=(0.1, 0.5, 1.0))
    text = markdown([s])
    assert len([line for line in text.splitlines() if line.startswith("| ")]) == 1 + len(s.points)
    assert all(p.open_sessions is None for p in s.points)
    assert text.splitlines()[-1].endswith("| - | - |")
    plot([s], tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    goals = goal_checks([s])
    assert set(goals) == {"within_10pct_of_belady_at_25pct_plus",
                          "within_10pct_of_belady_trim_at_25pct_plus",
                          "at_or_above_page_rounded"}
    json.dumps(goals)

    bounded = sweep_trace("tiny", trace, B, fractions=(0.1, 0.5, 1.0),
                          sessions=[f"s{i % 3}" for i in range(len(trace))])
    assert bounded.points[-1].open_sessions == pytest.approx(bounded.upper_bound)
    for p in bounded.points:
        assert 0 <= p.open_sessions_now <= bounded.upper_bound + 1e-9
    plot([bounded], tmp_path / "bounded.png")


def test_tail_trimming_simulator_never_holds_more_than_budget_and_never_loses_to_whole_leaves():
    trace = random_trace(4, n=80)
    for budget in (6, 15, 40):
        cache = BeladyCache(trace, B, "lru", trim_tails=True)
        for i, (ns, _) in enumerate(trace):
            cache.serve(ns, i)
            cache.evict_to(budget, now=i)
            assert cache.used_blocks <= budget
        trimmed = replay_belady(trace, B, budget, policy="lru", trim_tails=True)
        whole = replay_belady(trace, B, budget, policy="lru")
        assert trimmed.reused_tokens >= whole.reused_tokens


def test_popularity_policy_keeps_the_prefix_most_requests_share():
    hot, cold = list(range(100, 164)), list(range(200, 264))      # 4 blocks each
    trace = [("n", hot + [1]), ("n", hot + [2]), ("n", cold + [3]), ("n", hot + [4]),
             ("n", hot + [5])]
    lru = replay_belady(trace, B, budget_blocks=5, policy="lru", trim_tails=True)
    popular = replay_belady(trace, B, budget_blocks=5, policy="popularity", trim_tails=True)
    assert popular.reused_tokens > lru.reused_tokens


def test_random_policy_is_seeded_and_compare_table_lists_every_policy():
    trace = random_trace(2, n=50)
    runs = {replay_belady(trace, B, 10, policy="random").reused_tokens for _ in range(2)}
    assert len(runs) == 1
    table = compare_policies({"t": trace}, B, fractions=(0.5,))
    header, rule, row = table.splitlines()
    assert header.split(" | ")[2:] == ["radixgate", "lru", "random", "gdsf", "popularity",
                                       "open_sessions", "open_sessions_now", "belady |"]
    assert row.startswith("| t | 50% |") and row.endswith("| - | - | " + row.split(" | ")[-1])
    with_sessions = compare_policies({"t": trace}, B, fractions=(0.5,),
                                     sessions={"t": ["s"] * len(trace)})
    assert " - " not in with_sessions.splitlines()[2]


def test_open_sessions_policy_keeps_what_open_sessions_will_send_again():
    own_a, own_b = list(range(100, 164)), list(range(200, 264))   # 4 blocks each
    # a opens, b opens and finishes, a comes back: LRU keeps b's (finished) prompt instead
    trace = [("n", own_a + [1]), ("n", own_b + [2]), ("n", own_a + [1, 3])]
    sessions = ["a", "b", "a"]
    lru = replay_belady(trace, B, budget_blocks=5, policy="lru", trim_tails=True)
    open_ = replay_belady(trace, B, budget_blocks=5, policy="open_sessions", trim_tails=True,
                          sessions=sessions)
    assert lru.reused_tokens == 0
    assert open_.reused_tokens == len(own_a) + 1


def test_open_sessions_policy_prefers_a_prefix_a_later_session_will_send():
    early, late = list(range(100, 164)), list(range(200, 264))
    # after request 1 nothing is open; only the prefix of request 0 comes back (session c)
    trace = [("n", early + [1]), ("n", late + [2]), ("n", early + [3])]
    open_ = replay_belady(trace, B, budget_blocks=5, policy="open_sessions", trim_tails=True,
                          sessions=["a", "b", "c"])
    assert open_.reused_tokens == len(early)
    # knowing only the sessions open now, both are equal and LRU drops the older one
    now_only = replay_belady(trace, B, budget_blocks=5, policy="open_sessions_now",
                             trim_tails=True, sessions=["a", "b", "c"])
    assert now_only.reused_tokens == 0


@pytest.mark.parametrize("policy", ["open_sessions", "open_sessions_now"])
def test_session_policies_need_every_requests_session(policy):
    with pytest.raises(ValueError, match="session of every request"):
        BeladyCache([("n", [1, 2])], B, policy=policy)
    with pytest.raises(ValueError, match="session of every request"):
        BeladyCache([("n", [1, 2])], B, policy=policy, sessions=["a", "b"])


def test_tool_call_answers_read_from_the_next_request_of_the_session():
    agents = make_workloads(quick=True, seed=0, names=("agents",))[0]
    trace = workload_trace(agents, load_tokenizer())
    by_session: dict[str, list[bool]] = {}
    for entry in trace:
        by_session.setdefault(entry.session, []).append(entry.ends_in_tool_call)
    for flags in by_session.values():            # every step but the final answer
        assert flags == [True] * (len(flags) - 1) + [False]
    chat = make_workloads(quick=True, seed=0, names=("multi_turn",))[0]
    assert not any(e.ends_in_tool_call for e in workload_trace(chat, load_tokenizer()))


def test_continuation_hints_help_an_agent_trace_under_pressure():
    """Two agent loops on one tenant prefix, interleaved with one-off prompts that push
    them out: with the hint, the loops' history survives the one-offs."""
    prefix = list(range(1000, 1032))
    loops = {a: prefix + [2000 + a] * 8 for a in range(2)}
    trace, calls = [], []
    for step in range(6):
        for a in range(2):
            loops[a] = loops[a] + [3000 + 10 * a + step] * 8
            trace.append(("t", list(loops[a])))
            calls.append(step < 5)
        trace.append(("t", list(range(5000 + 100 * step, 5000 + 100 * step + 40))))
        calls.append(False)
    hinted = replay_radix(trace, 4, 30, tool_calls=calls)      # 4-token blocks
    unhinted = replay_radix(trace, 4, 30)
    assert hinted.reused_tokens > unhinted.reused_tokens
