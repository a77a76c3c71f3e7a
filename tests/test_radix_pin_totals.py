"""Pinned totals kept current (``PinTotals``) through splits, adopted blocks, owner changes,
expiry, re-arming hits and flushes; each scenario is also recounted by ``check_integrity``."""

from tests.support.radix import cache, hit, make_clocked_tree

B = 4


def make_tree(num_blocks=64):
    return make_clocked_tree(num_blocks, B)


def path_blocks(tree, tokens, namespace="ns"):
    """Blocks held by the nodes on the cached path of ``tokens`` (without touching it)."""
    node, pos, blocks = tree.namespace(namespace).root, 0, set()
    while pos < len(tokens) and tokens[pos] in node.children:
        node = node.children[tokens[pos]]
        blocks.update(node.blocks)
        pos = node.end
    return blocks


def test_split_inside_a_pinned_path_keeps_totals():
    pool, tree, _ = make_tree()
    pinned = [1] * 8 + [2] * 4
    cache(pool, tree, pinned)
    tree.pin("ns", pinned, ttl_s=60, owner="a")
    cache(pool, tree, [1] * 6 + [3] * 3)          # splits the pinned node inside block 1
    assert tree.pinned_tokens() == 12 and tree.pinned_tokens("a") == 12
    assert tree.pinned_blocks() == path_blocks(tree, pinned)
    assert tree.pinned_block_count() == 3
    tree.check_integrity()


def test_adopted_boundary_block_moves_the_pinned_block():
    pool, tree, _ = make_tree()
    cache(pool, tree, [1] * 6)                     # ends inside block 1
    tree.pin("ns", [1] * 6, ttl_s=60, owner="a")
    before = tree.pinned_blocks()
    cache(pool, tree, [1] * 6 + [2] * 4)           # extends it with its own copy of block 1
    after = tree.pinned_blocks()
    assert after != before                         # the node took the request's copy
    assert after == path_blocks(tree, [1] * 6)
    assert tree.pinned_tokens("a") == 6
    tree.check_integrity()


def test_repin_by_another_owner_moves_the_tokens():
    pool, tree, _ = make_tree()
    cache(pool, tree, [1] * 8)
    tree.pin("ns", [1] * 8, ttl_s=60, owner="a")
    tree.pin("ns", [1] * 8, ttl_s=60, owner="b")
    assert tree.pinned_tokens("a") == 0 and tree.pinned_tokens("b") == 8
    assert tree.pinned_tokens() == 8
    tree.check_integrity()


def test_shared_path_counts_once_per_owner_and_once_in_all():
    pool, tree, _ = make_tree()
    cache(pool, tree, [1] * 8 + [2] * 4)
    cache(pool, tree, [1] * 8 + [3] * 4)
    tree.pin("ns", [1] * 8 + [2] * 4, ttl_s=60, owner="a")
    tree.pin("ns", [1] * 8 + [3] * 4, ttl_s=60, owner="b")
    assert tree.pinned_tokens("a") == 12 and tree.pinned_tokens("b") == 12
    assert tree.pinned_tokens() == 16
    assert tree.stats().namespaces["ns"].pinned_tokens == 16
    tree.unpin("ns", [1] * 8 + [2] * 4)
    assert tree.pinned_tokens("a") == 0 and tree.pinned_tokens() == 12
    tree.check_integrity()


def test_expiry_uncounts_and_a_hit_rearms():
    pool, tree, clock = make_tree()
    cache(pool, tree, [1] * 8)
    tree.pin("ns", [1] * 8, ttl_s=5, owner="a")
    clock.now += 3
    hit(pool, tree, [1] * 8)                      # expiry moves to now + 5
    clock.now += 3
    assert tree.pinned_tokens("a") == 8           # past the first expiry, not the second
    clock.now += 3
    assert tree.pinned_tokens("a") == 0 and tree.pinned_block_count() == 0
    hit(pool, tree, [1] * 8)                      # an expired pin still attached is re-armed
    assert tree.pinned_tokens("a") == 8
    tree.check_integrity()


def test_shorter_repin_expires_at_the_shorter_time():
    pool, tree, clock = make_tree()
    cache(pool, tree, [1] * 8)
    tree.pin("ns", [1] * 8, ttl_s=100, owner="a")
    tree.pin("ns", [1] * 8, ttl_s=2, owner="a")
    clock.now += 3
    assert tree.pinned_tokens() == 0
    tree.check_integrity()


def test_repinning_every_request_keeps_the_due_heap_small():
    pool, tree, clock = make_tree()
    cache(pool, tree, [1] * 8)
    for i in range(5000):
        clock.now += 0.01
        tree.pin("ns", [1] * 8, ttl_s=1000 - i * 0.1, owner="a")   # each ends sooner
        assert tree.pinned_tokens("a") == 8
    assert len(tree.pins.due) <= 2 + 1024
    tree.check_integrity()


def test_flush_and_eviction_of_expired_pins_zero_the_totals():
    pool, tree, clock = make_tree(num_blocks=8)
    cache(pool, tree, [1] * 8)
    cache(pool, tree, [2] * 8, namespace="other")
    tree.pin("ns", [1] * 8, ttl_s=5, owner="a")
    tree.pin("other", [2] * 8, ttl_s=500, owner="b")
    clock.now += 6
    tree.evict(2)                                  # the expired pin goes (ttl)
    assert tree.pinned_tokens("a") == 0 and tree.pinned_tokens("b") == 8
    tree.flush("other")
    assert tree.pinned_tokens() == 0 and tree.pinned_blocks() == set()
    assert tree.stats().pinned_tokens == 0 and tree.stats().pinned_blocks == 0
    tree.check_integrity()
