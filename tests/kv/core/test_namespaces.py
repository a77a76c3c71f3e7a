"""Namespace lifetime and the per-tenant cap (radixgate/kv/core/namespaces.py), and each tenant's
hottest prefixes from its own namespaces (radixgate/kv/core/reports.py)."""

import heapq
import random

import pytest

from radixgate.kv import BlockPool, RadixTree
from radixgate.kv.core.reports import iter_nodes
from tests.support.radix import cache, hit, make_clocked_tree

B = 4


def make_tree(num_blocks=256):
    pool = BlockPool(num_blocks, B)
    return pool, RadixTree(pool)


def request(pool, tree, namespace, tokens, tenant="t", cap=None):
    """What the engine does for one request: open, match, cache, unlock, close."""
    tree.open_namespace(namespace, tenant, cap)
    match = tree.match(namespace, tokens)
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
    cache(pool, tree, tokens, namespace)
    tree.close_namespace(namespace)


def test_namespace_is_dropped_when_its_last_node_is_evicted():
    pool, tree = make_tree()
    cache(pool, tree, [1] * 8, namespace="a")
    cache(pool, tree, [2] * 8, namespace="b")
    assert len(tree.namespaces) == 2
    assert tree.evict(2) == 2                       # a's leaf: least recently used
    assert tree.namespace("a") is None and tree.namespace("b") is not None
    assert tree.stats().num_namespaces == 1
    tree.check_integrity()


def test_namespace_is_dropped_by_a_flush_and_a_match_on_an_empty_one_leaves_nothing():
    pool, tree = make_tree()
    cache(pool, tree, [1] * 8, namespace="a")
    hit(pool, tree, [5] * 8, namespace="never-cached")
    assert tree.namespace("never-cached") is None
    tree.flush("a")
    assert len(tree.namespaces) == 0 and pool.num_free() == pool.num_blocks
    tree.check_integrity()


def test_namespace_is_kept_while_a_lock_holds_it():
    pool, tree = make_tree()
    cache(pool, tree, [1] * 8, namespace="a")
    match = tree.match("a", [1] * 8)
    assert tree.flush() == 0 and tree.namespace("a") is not None
    empty = tree.match("b", [1] * 8)                # a lock on an empty namespace's root
    assert tree.namespace("b") is not None
    tree.check_integrity(extra_holders=[match.blocks])
    tree.unlock(empty.handle)
    assert tree.namespace("b") is None
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
    assert tree.namespace("a") is not None          # still caches its tokens
    tree.evict(10)
    assert tree.namespace("a") is None
    tree.check_integrity()


def test_namespace_is_kept_while_an_unexpired_pin_holds_it():
    pool, tree, clock = make_clocked_tree()
    cache(pool, tree, [1] * 8, namespace="a")
    tree.pin("a", [1] * 8, ttl_s=10)
    assert tree.evict(10) == 0 and tree.namespace("a") is not None
    clock.now += 11
    assert tree.evict(10) == 2
    assert tree.namespace("a") is None and tree.stats().evictions["ttl"] == 1
    tree.check_integrity()


def test_an_open_namespace_lives_until_closed_then_as_long_as_it_caches():
    pool, tree = make_tree()
    tree.open_namespace("a", "acme")
    assert tree.namespace("a").tenant == "acme"
    tree.close_namespace("a")
    assert tree.namespace("a") is None              # nothing cached: gone
    request(pool, tree, "a", [1] * 8, tenant="acme")
    assert tree.namespace("a") is not None
    tree.open_namespace("a", "acme")
    assert tree.flush() == 2 and tree.namespace("a") is not None   # open: kept, emptied
    tree.close_namespace("a")
    assert tree.namespace("a") is None
    with pytest.raises(ValueError, match="not open"):
        tree.close_namespace("a")
    tree.check_integrity()


def test_live_namespaces_per_tenant_stay_within_the_cap_and_others_are_untouched():
    pool, tree = make_tree()
    request(pool, tree, "victim-ns", [9] * 8, tenant="victim", cap=4)
    for salt in range(200):
        request(pool, tree, f"salt-{salt}", [1, 2, salt % 7 + 3] * 3, tenant="attacker", cap=4)
        assert tree.namespaces.count_of("attacker") <= 4
        assert len(tree.namespaces) <= 5
    assert tree.namespace("victim-ns") is not None
    assert tree.peek_length("victim-ns", [9] * 8) == 8
    held = sum(1 for b in range(pool.num_blocks) if pool.refcount(b))
    assert held <= 5 * 3                           # at most 5 namespaces of <= 3 blocks each
    tree.check_integrity()


def test_dropped_namespaces_leave_no_nodes_behind_in_the_eviction_heaps():
    pool, tree = make_tree()
    for salt in range(3000):
        request(pool, tree, f"salt-{salt}", [1, 2, 3] * 3, cap=2)
    assert tree.namespaces.count_of("t") == 2
    assert tree.policy.size() <= 2 * tree.num_nodes + 1024 + 2
    tree.check_integrity()


def test_cap_drops_the_least_recently_opened_namespace_first():
    pool, tree = make_tree()
    request(pool, tree, "a", [1] * 8, cap=2)
    request(pool, tree, "b", [2] * 8, cap=2)
    request(pool, tree, "a", [1] * 8, cap=2)        # a is now the most recent
    request(pool, tree, "c", [3] * 8, cap=2)
    assert tree.namespace("b") is None
    assert tree.namespace("a") is not None and tree.namespace("c") is not None
    tree.check_integrity()


def test_busy_namespaces_exceed_the_cap_until_their_requests_close():
    pool, tree = make_tree()
    for name in "abcde":                            # five requests waiting at once
        tree.open_namespace(name, "t", 2)
    assert tree.namespaces.count_of("t") == 5      # all busy: exceeded, not refused
    for name in "abcde":
        cache(pool, tree, [ord(name)] * 8, name)
        tree.close_namespace(name)
    assert tree.namespaces.count_of("t") == 2
    assert tree.namespace("d") is not None and tree.namespace("e") is not None
    tree.check_integrity()


def test_cap_keeps_pinned_content_and_evicts_the_rest_of_a_namespace():
    pool, tree, clock = make_clocked_tree(num_blocks=256)
    request(pool, tree, "pinned", [1] * 8, cap=1)
    cache(pool, tree, [1] * 8 + [2] * 8, "pinned")
    tree.pin("pinned", [1] * 8, ttl_s=100)
    request(pool, tree, "other", [3] * 8, cap=1)
    assert tree.namespace("pinned") is not None    # pinned: kept (over the cap)
    assert tree.peek_length("pinned", [1] * 8 + [2] * 8) == 8   # its unpinned tail went
    assert tree.namespace("other") is None         # the pinned one fills the cap of 1
    clock.now += 101
    request(pool, tree, "third", [4] * 8, cap=1)
    assert tree.namespaces.count_of("t") == 1 and tree.namespace("third") is not None
    tree.check_integrity()


def test_each_tenant_gets_its_own_top_prefixes_whatever_the_others_do():
    pool, tree = make_tree(num_blocks=1024)
    for p in range(30):                             # the attacker: 30 prefixes, 6 hits each
        tokens = [100 + p] * 8
        request(pool, tree, f"attacker-{p % 3}", tokens, tenant="attacker")
        for _ in range(6):
            hit(pool, tree, tokens, namespace=f"attacker-{p % 3}")
    request(pool, tree, "victim", [7] * 8, tenant="victim")
    for _ in range(2):
        hit(pool, tree, [7] * 8, namespace="victim")
    by_tenant = tree.top_prefixes_by_tenant(10)
    assert [(p.tokens, p.hits, p.tenant) for p in by_tenant["victim"]] == [((7,) * 8, 2, "victim")]
    assert len(by_tenant["attacker"]) == 10
    assert all(p.tenant == "attacker" and p.hits == 6 for p in by_tenant["attacker"])
    assert [p.hits for p in tree.top_prefixes(10)] == [6] * 10   # the server-wide list
    tree.check_integrity()


def brute_force_top(tree, n):
    nodes = [node for ns in tree.namespaces for node in iter_nodes(ns.root)
             if node.hits or node.pin is not None]
    return [(node.hits, node.end) for node in heapq.nlargest(n, nodes, key=lambda x: (x.hits, x.end))]


@pytest.mark.parametrize("seed", range(5))
def test_best_first_top_prefixes_equal_a_full_walk(seed):
    rng = random.Random(seed)
    pool, tree = make_tree(num_blocks=4096)
    prompts = [[rng.randrange(4) for _ in range(rng.randrange(1, 20))] for _ in range(60)]
    for tokens in prompts:
        request(pool, tree, f"ns{rng.randrange(3)}", tokens)
    for _ in range(300):
        hit(pool, tree, rng.choice(prompts)[:rng.randrange(1, 20)], namespace=f"ns{rng.randrange(3)}")
    tree.pin("ns0", prompts[0], ttl_s=1e9)
    for n in (1, 3, 10, 50):
        found = [(p.hits, p.length) for p in tree.top_prefixes(n)]
        assert found == brute_force_top(tree, n)
    tree.check_integrity()
