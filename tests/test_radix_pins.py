"""Pins: TTL from an injectable clock, refreshed by hits, never evicted before expiry."""

import pytest

from tests.support.radix import cache, hit, make_clocked_tree

B = 4


def make_tree(num_blocks=64):
    return make_clocked_tree(num_blocks, B)


def test_pin_survives_eviction_until_expiry():
    pool, tree, clock = make_tree()
    pinned = cache(pool, tree, [1] * 8)
    cache(pool, tree, [2] * 8)
    assert tree.pin("ns", [1] * 8, ttl_s=60) == 8
    assert tree.evict(100) == 2                  # only the unpinned leaf goes
    assert all(pool.refcount(b) == 1 for b in pinned)
    clock.now += 61
    assert tree.evict(100) == 2
    stats = tree.stats()
    assert stats.evictions == {"lru": 1, "ttl": 1, "flush": 0}
    assert stats.num_pins == 0
    tree.check_integrity()


def test_hit_refreshes_pin_expiry():
    pool, tree, clock = make_tree()
    cache(pool, tree, [1] * 8)
    tree.pin("ns", [1] * 8, ttl_s=60)
    clock.now += 50
    hit(pool, tree, [1] * 8)
    clock.now += 50                               # 100 s after pinning, 50 s after the hit
    assert tree.evict(100) == 0
    assert tree.top_prefixes(1)[0].pin_ttl_s == pytest.approx(10)
    clock.now += 11
    assert tree.evict(100) == 2


def test_hit_on_descendant_refreshes_ancestor_pin():
    pool, tree, clock = make_tree()
    cache(pool, tree, [1] * 12)
    tree.pin("ns", [1] * 4, ttl_s=10)            # splits at 4: pin sits on [0,4)
    assert tree.stats().nodes == 2
    clock.now += 8
    hit(pool, tree, [1] * 12)
    clock.now += 8
    assert tree.pinned_tokens() == 4
    assert tree.evict(100) == 2                   # the unpinned leaf [4,12) only
    assert tree.stats().nodes == 1


def test_pin_at_longest_cached_prefix_splits_mid_node():
    pool, tree, _ = make_tree()
    cache(pool, tree, list(range(10)))
    assert tree.pin("ns", [0, 1, 2, 3, 4, 5, 99], ttl_s=5, owner="acme") == 6
    assert tree.stats().nodes == 2
    assert tree.pinned_tokens("acme") == 6
    assert tree.pinned_tokens("other") == 0
    tree.check_integrity()


def test_pin_of_uncached_prefix_pins_nothing():
    pool, tree, _ = make_tree()
    assert tree.pin("ns", [5, 5], ttl_s=5) == 0
    cache(pool, tree, [1, 2])
    assert tree.pin("ns", [5, 5], ttl_s=5) == 0
    assert tree.stats().num_pins == 0


def test_unpin_makes_pinned_leaf_evictable():
    pool, tree, _ = make_tree()
    cache(pool, tree, [1] * 8)
    tree.pin("ns", [1] * 8, ttl_s=60)
    assert tree.evict(10) == 0
    assert tree.unpin("ns", [1] * 8 + [3]) is True
    assert tree.unpin("ns", [1] * 8) is False
    assert tree.evict(10) == 2
    tree.check_integrity()


def test_pinned_tokens_count_shared_path_once():
    pool, tree, _ = make_tree()
    cache(pool, tree, [1] * 8 + [2] * 4)
    cache(pool, tree, [1] * 8 + [3] * 4)
    tree.pin("ns", [1] * 8 + [2] * 4, ttl_s=60, owner="a")
    tree.pin("ns", [1] * 8 + [3] * 4, ttl_s=60, owner="a")
    assert tree.pinned_tokens("a") == 16
    stats = tree.stats()
    assert stats.pinned_tokens == 16
    assert stats.pinned_blocks == 4
    assert stats.namespaces["ns"].pinned_tokens == 16
    assert tree.pinned_blocks() == tree.held_blocks()
    assert tree.pinned_block_count() == 4


def test_expired_pin_is_not_counted_as_pinned():
    pool, tree, clock = make_tree()
    cache(pool, tree, [1] * 8)
    tree.pin("ns", [1] * 8, ttl_s=5, owner="a")
    clock.now += 6
    assert tree.pinned_tokens() == 0
    assert tree.stats().num_pins == 1             # still attached until evicted or unpinned


def test_hit_after_expiry_rearms_pin_before_eviction():
    pool, tree, clock = make_tree()
    cache(pool, tree, [1] * 8)
    tree.pin("ns", [1] * 8, ttl_s=5)
    clock.now += 6
    hit(pool, tree, [1] * 8)
    assert tree.evict(10) == 0
    clock.now += 6
    assert tree.evict(10) == 2
    tree.check_integrity()


def test_repin_replaces_owner_and_ttl():
    pool, tree, clock = make_tree()
    cache(pool, tree, [1] * 8)
    tree.pin("ns", [1] * 8, ttl_s=5, owner="a")
    tree.pin("ns", [1] * 8, ttl_s=50, owner="b")
    assert tree.stats().num_pins == 1
    clock.now += 10
    assert tree.evict(10) == 0
    top = tree.top_prefixes(1)[0]
    assert top.owner == "b" and top.pin_ttl_s == pytest.approx(40)


def test_repinning_a_prefix_on_every_request_keeps_one_pin_and_a_small_queue():
    pool, tree, clock = make_tree()
    prompt = list(range(1, 33))
    cache(pool, tree, prompt)
    for i in range(2000):                  # each request repeats the same breakpoint
        clock.now += 0.01
        hit(pool, tree, prompt)
        assert tree.pin("ns", prompt, 300, owner="t" if i % 2 else "u") == 32
    assert len(tree.pinned_nodes) == 1
    assert tree.policy.size() + len(tree.pins.expiries) < 10          # no entry per re-pin (and no evict to clean up)
    assert tree.pinned_tokens("t") == 32 and tree.pinned_tokens("u") == 0
    tree.check_integrity()


def test_repinning_with_a_shorter_ttl_expires_at_the_new_time():
    pool, tree, clock = make_tree(num_blocks=8)
    pinned = [1] * 8
    cache(pool, tree, pinned)
    tree.pin("ns", pinned, 100, owner="t")
    tree.pin("ns", pinned, 5, owner="t")   # shortened: must not wait for the old 100 s
    clock.now += 6
    assert tree.evict(2) == 2
    assert tree.peek_length("ns", pinned) == 0
    tree.check_integrity()
