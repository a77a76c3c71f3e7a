"""Eviction: LRU order over unlocked leaves, own-block counting, flush, events."""

from radixgate.kv import BlockPool, CacheEvent, RadixTree
from tests.support.radix import cache, hit

B = 4


def make_tree(num_blocks=64, events=None):
    pool = BlockPool(num_blocks, B)
    return pool, RadixTree(pool, on_event=None if events is None else events.append)


    return match


def test_evict_takes_least_recently_used_leaf_first():
    pool, tree = make_tree()
    a = cache(pool, tree, [1] * 8)
    b = cache(pool, tree, [2] * 8)
    c = cache(pool, tree, [3] * 8)
    hit(pool, tree, [1] * 8)
    assert tree.evict(2) == 2
    assert all(pool.refcount(x) == 0 for x in b)
    assert all(pool.refcount(x) == 1 for x in a + c)
    assert tree.evict(2) == 2
    assert all(pool.refcount(x) == 0 for x in c)
    assert tree.stats().evictions["lru"] == 2
    tree.check_integrity()


def test_lock_prevents_eviction():
    pool, tree = make_tree()
    cache(pool, tree, list(range(8)))
    match = tree.match("ns", list(range(8)))
    tree.unlock(match.handle)
    relocked = tree.match("ns", list(range(8)))
    assert tree.evict(10) == 0
    tree.unlock(relocked.handle)
    assert tree.evict(10) == 0          # the caller still holds references: nothing freed yet
    assert tree.stats().nodes == 0
    pool.decref_many(match.blocks)
    pool.decref_many(relocked.blocks)
    assert pool.num_free() == 64
    tree.check_integrity()


def test_partial_match_locks_only_the_matched_head_and_the_tail_stays_evictable():
    pool, tree = make_tree()
    cache(pool, tree, list(range(12)))
    match = tree.match("ns", list(range(5)))      # splits [0, 12) at 5
    assert tree.evictable_blocks == 1             # the tail's own block (block 1 is shared)
    assert tree.evict(10) == 1
    tree.check_integrity([match.blocks])
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
    assert tree.evict(10) == 2
    assert pool.num_free() == 64
    tree.check_integrity()


def test_parent_becomes_evictable_when_last_child_goes():
    pool, tree = make_tree()
    cache(pool, tree, list(range(8)) + [100, 101, 102, 103])
    cache(pool, tree, list(range(8)) + [200, 201, 202, 203])
    assert tree.stats().nodes == 3
    assert tree.evict(2) == 2           # both leaves (one own block each)
    assert tree.stats().nodes == 1
    assert tree.evict(1) == 1           # then the parent's tail: one block, no more
    assert tree.evict(1) == 1           # and its last block
    assert pool.num_free() == 64
    tree.check_integrity()


def test_evict_counts_only_own_blocks_of_a_child_sharing_its_boundary_block():
    pool, tree = make_tree()
    cache(pool, tree, list(range(10)))
    cache(pool, tree, [0, 1, 2, 3, 4, 5, 70, 71])
    hit(pool, tree, [0, 1, 2, 3, 4, 5, 70, 71])       # the [6,10) leaf is now LRU
    assert tree.stats().evictable_blocks == 4          # [0,6): 2, [6,10): 1, [6,8): 1
    assert tree.evict(1) == 1
    # its tail block went; [6,8) stays cached in the block it shares with [0,6) (free)
    assert tree.stats().nodes == 3 and tree.stats().cached_tokens == 10
    assert tree.peek_length("ns", list(range(10))) == 8
    tree.check_integrity()


def test_evict_frees_nothing_for_blocks_a_request_still_holds():
    pool, tree = make_tree()
    blocks = pool.allocate(2)
    tree.insert("ns", list(range(8)), blocks)
    assert tree.evict(2) == 0
    assert pool.refcount(blocks[0]) == 1
    tree.check_integrity([blocks])


def test_evict_never_rescans_locked_leaves_forever():
    pool, tree = make_tree()
    cache(pool, tree, [1] * 4)
    match = tree.match("ns", [1] * 4)
    for _ in range(3):
        assert tree.evict(1) == 0
    assert len(tree.policy.heap) == 0         # the locked leaf left the heap; unlock puts it back
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
    assert tree.evict(1) == 1


def test_flush_namespace_only():
    pool, tree = make_tree()
    cache(pool, tree, [1] * 8, namespace="a")
    kept = cache(pool, tree, [1] * 8, namespace="b")
    assert tree.flush("a") == 2
    stats = tree.stats()
    assert "a" not in stats.namespaces and stats.namespaces["b"].nodes == 1   # "a" emptied: dropped
    assert all(pool.refcount(x) == 1 for x in kept)
    assert stats.evictions["flush"] == 1
    tree.check_integrity()


def test_flush_keeps_locked_paths_and_drops_pins():
    pool, tree = make_tree()
    cache(pool, tree, [1] * 8)
    cache(pool, tree, [1] * 4 + [2] * 4)
    tree.pin("ns", [1] * 8, ttl_s=100)
    match = tree.match("ns", [1] * 4 + [2] * 4)
    assert tree.flush() == 1          # the pinned leaf [4,8) of [1]*8 (one own block)
    assert tree.stats().num_pins == 0
    assert tree.stats().nodes == 2      # the locked path [0,4) -> [4,8) of request 2
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
    tree.check_integrity()


def test_events_emitted_for_store_and_removal():
    events = []
    pool, tree = make_tree(events=events)
    blocks = cache(pool, tree, list(range(8)), namespace="t")
    tree.evict(5)
    assert events == [
        CacheEvent("stored", "t", tuple(blocks), 0, 8),
        CacheEvent("removed", "t", tuple(blocks), 0, 8, "lru"),
    ]


def test_a_partial_last_block_is_given_back_before_the_rest_of_its_leaf():
    events = []
    pool, tree = make_tree(events=events)
    blocks = cache(pool, tree, list(range(6)), namespace="t")
    tree.evict(5)
    assert events[1:] == [
        CacheEvent("removed", "t", (blocks[1],), 4, 6, "lru"),
        CacheEvent("removed", "t", (blocks[0],), 0, 4, "lru"),
    ]
    assert pool.num_free() == pool.num_blocks


def test_evict_1000_blocks_from_many_leaves_returns_count_freed():
    pool, tree = make_tree(num_blocks=600)
    for i in range(100):
        cache(pool, tree, [i % 7] * 8 + [1000 + i] * 16)
    before = pool.num_free()
    freed = tree.evict(250)
    assert freed >= 250
    assert pool.num_free() - before == freed
    tree.check_integrity()


def test_flush_leaves_no_stale_heap_entries():
    pool, tree = make_tree()
    for i in range(5):
        cache(pool, tree, [i] * 8)
    tree.pin("ns", [0] * 8, ttl_s=100)
    tree.flush()
    assert tree.policy.size() == 0 and not tree.pins.expiries
    cache(pool, tree, [9] * 8)
    assert tree.evict(2) == 2
    tree.check_integrity()


def test_evict_trims_a_large_leafs_tail_and_keeps_its_prefix_matchable():
    events = []
    pool, tree = make_tree(events=events)
    blocks = cache(pool, tree, list(range(40)))              # one leaf, 10 blocks
    free_before = pool.num_free()
    assert tree.evict(3) == 3                                # only what was asked for
    assert pool.num_free() == free_before + 3
    assert all(pool.refcount(b) == 0 for b in blocks[7:])
    assert all(pool.refcount(b) == 1 for b in blocks[:7])
    assert events[-1] == CacheEvent("removed", "ns", tuple(blocks[7:]), 28, 40, "lru")
    match = tree.match("ns", list(range(40)))
    assert (match.length, match.blocks) == (28, blocks[:7])
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
    stats = tree.stats()
    assert stats.evictions["lru"] == 1 and stats.evicted_tokens["lru"] == 12
    assert stats.cached_tokens == 28
    tree.check_integrity()


def test_trimmed_leaf_stays_evictable_and_goes_whole_when_more_is_needed():
    pool, tree = make_tree()
    cache(pool, tree, list(range(40)))
    other = cache(pool, tree, [99] * 8)                      # more recent, 2 blocks
    assert tree.evict(2) == 2                                # trims the older leaf
    assert tree.evict(8) == 8                                # the rest of it goes whole
    assert all(pool.refcount(b) == 1 for b in other)
    assert tree.stats().cached_tokens == 8
    tree.check_integrity()


def test_trim_keeps_a_boundary_block_shared_with_the_parent():
    pool, tree = make_tree()
    blocks = cache(pool, tree, list(range(20)))              # one leaf, blocks 0..4
    cache(pool, tree, list(range(6)) + [90, 91])             # split at 6, inside block 1
    hit(pool, tree, list(range(6)) + [90, 91])               # the new branch is not the LRU
    free_before = pool.num_free()
    assert tree.evict(2) == 2                                # [6, 20) keeps [6, 12)
    assert pool.num_free() == free_before + 2
    assert pool.refcount(blocks[1]) == 2                     # still parent's and child's
    match = tree.match("ns", list(range(20)))
    assert (match.length, match.blocks) == (12, blocks[:3])
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
    tree.check_integrity()


def test_an_expired_pin_is_evicted_whole_never_trimmed():
    now = [0.0]
    pool = BlockPool(64, B)
    tree = RadixTree(pool, clock=lambda: now[0])
    cache(pool, tree, list(range(40)))
    tree.pin("ns", list(range(40)), ttl_s=5)
    assert tree.evict(1) == 0                                # unexpired pin: untouched
    now[0] = 10
    assert tree.evict(1) == 10
    assert tree.stats().evictions["ttl"] == 1
    tree.check_integrity()


def test_trim_of_a_leaf_sharing_blocks_with_another_namespace_keeps_both_consistent():
    pool, tree = make_tree()
    shared = cache(pool, tree, list(range(16)), namespace="public")        # 4 blocks
    match = tree.match("public", list(range(16)))                          # a tenant reads it
    own = pool.allocate(4)
    tree.insert("t", list(range(32)), match.blocks + own)                  # and caches it as its own
    tree.unlock(match.handle)
    pool.decref_many(match.blocks + own)
    hit(pool, tree, list(range(16)), namespace="public")                   # t's leaf is the LRU one
    assert tree.evict(4) == 4                                              # t's own tail
    assert all(pool.refcount(b) == 0 for b in own)
    assert all(pool.refcount(b) == 2 for b in shared)
    assert tree.evict(1) == 1            # a shared block dropped by t frees nothing: go on
    assert tree.stats().cached_tokens < 32
    tree.check_integrity()
    public = tree.match("public", list(range(16)))
    assert public.length >= 12
