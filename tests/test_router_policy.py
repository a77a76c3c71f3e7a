"""The routing policy shared by the Ray Serve router and the simulator: longest cached
prefix within the namespace, balanced against load; the prefix index fed by KV events."""
from __future__ import annotations

from radixgate.cluster.policy import PrefixRouter, RoutingParams, home_replica
from radixgate.cluster.prefix_index import PrefixIndex
from radixgate.kv.events.wire import AllBlocksCleared, BlockRemoved, BlockStored

B = 4
SEED = "seed"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def router(**params) -> tuple[PrefixRouter, Clock]:
    clock = Clock()
    p = RoutingParams(**params)
    return PrefixRouter(SEED, B, p, PrefixIndex(p.routed_ttl_s, clock)), clock


def stored(r: PrefixRouter, replica: str, namespace: str, tokens: list[int]) -> None:
    r.index.apply(replica, [BlockStored(tuple(r.block_ids(namespace, tokens)), None,
                                        tuple(tokens), B)])


PROMPT = list(range(40))                     # 10 full blocks


def test_the_replica_with_the_longest_cached_prefix_wins_while_loads_are_balanced():
    r, _ = router(load_tokens=4)
    stored(r, "a", "ns", PROMPT[:8])
    stored(r, "b", "ns", PROMPT[:32])
    decision = r.rank("ns", PROMPT, {"a": 0, "b": 1, "c": 0})
    assert decision.ranked[0] == "b" and decision.matched_blocks == 8
    assert decision.reason == "prefix"
    assert sorted(decision.ranked) == ["a", "b", "c"]


def test_an_overloaded_replica_loses_its_prefix_to_the_least_loaded():
    r, _ = router(balance_abs=2, balance_rel=1.5, load_tokens=1)
    stored(r, "b", "ns", PROMPT)
    assert r.rank("ns", PROMPT, {"a": 1, "b": 4}, note=False).ranked[0] == "a"
    assert r.rank("ns", PROMPT, {"a": 1, "b": 3}, note=False).ranked[0] == "b"


def test_load_weighs_against_a_short_match():
    r, _ = router(load_tokens=16)
    stored(r, "b", "ns", PROMPT[:8])          # 8 cached tokens < one request's weight
    assert r.rank("ns", PROMPT, {"a": 0, "b": 1}, note=False).ranked[0] == "a"
    stored(r, "b", "ns", PROMPT)              # 40 tokens > 16
    assert r.rank("ns", PROMPT, {"a": 0, "b": 1}, note=False).ranked[0] == "b"


def test_another_namespace_never_matches_the_same_tokens():
    r, _ = router()
    stored(r, "b", "tenant-a", PROMPT)
    decision = r.rank("tenant-b", PROMPT, {"a": 0, "b": 0}, note=False)
    assert decision.matched_blocks == 0 and decision.reason == "home"


def test_requests_routed_together_stay_together_before_any_event_arrives():
    r, clock = router(routed_ttl_s=5.0, load_tokens=4)
    loads = {name: 0 for name in "abcdefgh"}
    first = r.rank("ns", PROMPT, loads).ranked[0]
    loads[first] += 1
    assert r.rank("ns", PROMPT + [1, 2, 3, 4], loads).ranked[0] == first
    clock.now = 6.0                            # never confirmed by a BlockStored: forgotten
    assert r.index.match(r.block_ids("ns", PROMPT), loads)[first] == 0


def test_a_stored_event_confirms_a_routed_guess_for_good():
    r, clock = router(routed_ttl_s=5.0)
    r.index.note_routed("a", r.block_ids("ns", PROMPT))
    stored(r, "a", "ns", PROMPT)
    clock.now = 100.0
    assert r.index.match(r.block_ids("ns", PROMPT), ["a"]) == {"a": 10}


def test_removed_cleared_and_dropped_replicas_leave_the_index():
    r, _ = router()
    ids = r.block_ids("ns", PROMPT)
    for name in "abc":
        stored(r, name, "ns", PROMPT)
    r.index.apply("a", [BlockRemoved(tuple(ids[4:]))])
    r.index.apply("b", [AllBlocksCleared()])
    r.index.drop_replica("c")
    assert r.index.match(ids, "abc") == {"a": 4, "b": 0, "c": 0}
    assert r.index.stored_blocks("a") == 4 and r.index.num_blocks == 4


def test_a_gap_in_the_chain_ends_the_match():
    r, _ = router()
    ids = r.block_ids("ns", PROMPT)
    r.index.apply("a", [BlockStored(tuple(ids[:3] + ids[5:]), None, (), B)])
    assert r.index.match(ids, ["a"]) == {"a": 3}


def test_new_prefixes_spread_and_the_home_is_stable_across_removals():
    replicas = [f"r{i}" for i in range(8)]
    homes = {home_replica(f"key{k}", replicas) for k in range(200)}
    assert homes == set(replicas)
    moved = sum(home_replica(f"key{k}", replicas) != home_replica(f"key{k}", replicas[1:])
                for k in range(200) if home_replica(f"key{k}", replicas) != "r0")
    assert moved == 0


def test_a_prompt_cache_key_hint_picks_the_same_home_for_different_prompts():
    r, _ = router()
    loads = {name: 0 for name in "abcdefgh"}
    a = r.rank("ns", PROMPT, loads, hint="conversation-7", note=False).ranked[0]
    b = r.rank("ns", list(range(500, 540)), loads, hint="conversation-7", note=False).ranked[0]
    assert a == b
