"""``_adopt_boundary_block``: a node ending inside its last block takes the extending
request's private copy of that block. Its own-block count, the evictable counters, the pin
totals and the pool must stay exact through adoption under a lock, under a pin, with a
caller still holding the old block, and through the eviction that follows (pure Python)."""

from radixgate.kv import BlockPool, RadixTree
from tests.support.radix import make_clocked_tree

B = 4
HEAD = [1, 2, 3, 4, 5, 6]            # one node [0, 6): a full block and a partial one


def build(num_blocks=32, clocked=False):
    if clocked:
        pool, tree, clock = make_clocked_tree(num_blocks, B)
    else:
        pool, clock = BlockPool(num_blocks, B), None
        tree = RadixTree(pool)
    blocks = pool.allocate(2)
    tree.insert("ns", HEAD, blocks)
    pool.decref_many(blocks)
    return pool, tree, clock, blocks


def extend(pool, tree, match, tail, lock=False):
    """A request that matched HEAD, copied its partial block, computed ``tail`` and inserts
    the whole prompt; returns (its block table, the insert result)."""
    private = pool.allocate(1)[0]
    table = [match.blocks[0], private] + pool.allocate(-(-(len(HEAD) + len(tail)) // B) - 2)
    pool.decref(match.blocks[1])          # the copy-on-write source goes back
    result = tree.insert("ns", HEAD + tail, table, lock=lock)
    return table, result


def node_at(tree, end):
    ns = tree.namespace("ns")
    stack = list(ns.root.children.values())
    while stack:
        node = stack.pop()
        if node.end == end:
            return node
        stack.extend(node.children.values())
    raise AssertionError(f"no node ends at {end}")


def drain(pool, tree):
    """Everything unlocked and unpinned comes out: the pool is whole again."""
    freed = tree.evict(pool.num_blocks)
    tree.check_integrity()
    assert tree.evictable_blocks == 0 and tree.num_nodes == 0
    assert pool.num_free() == pool.num_blocks
    return freed


def test_adoption_under_the_matching_request_lock_keeps_counts_exact():
    pool, tree, _, (b0, b1) = build()
    match = tree.match("ns", HEAD + [7, 8, 9, 10])
    assert match.length == 6 and match.blocks == [b0, b1]
    table, result = extend(pool, tree, match, [7, 8, 9, 10], lock=True)
    tree.unlock(match.handle)                     # the lock moves to the inserted node
    head = node_at(tree, 6)
    assert head.blocks == [b0, table[1]]          # adopted the private copy
    assert pool.refcount(b1) == 0 and b1 in pool.free_blocks()
    assert head.own_blocks == 2 and node_at(tree, 10).own_blocks == 1
    tree.check_integrity([table])
    assert tree.evictable_blocks == 0             # the whole path is locked
    tree.unlock(result.handle)
    pool.decref_many(table)
    tree.check_integrity()
    assert tree.evictable_blocks == 3 == pool.num_blocks - pool.num_free()
    assert drain(pool, tree) == 3


def test_adoption_while_a_caller_still_holds_the_old_block_frees_nothing_early():
    pool, tree, _, (b0, b1) = build()
    reader = tree.match("ns", HEAD)               # holds b0 and b1, locks the head
    match = tree.match("ns", HEAD + [7, 8])
    table, _ = extend(pool, tree, match, [7, 8])
    tree.unlock(match.handle)
    assert node_at(tree, 6).blocks[-1] == table[1]
    assert pool.refcount(b1) == 1                 # only the reader holds it now
    tree.check_integrity([table, reader.blocks])
    pool.decref_many(table)
    tree.unlock(reader.handle)
    pool.decref_many(reader.blocks)
    tree.check_integrity()
    assert pool.num_free() == pool.num_blocks - 2     # b0 and the adopted copy
    assert drain(pool, tree) == 2


def test_adoption_under_a_pin_moves_the_pinned_block_and_eviction_waits_for_expiry():
    pool, tree, clock, (b0, b1) = build(clocked=True)
    assert tree.pin("ns", HEAD, ttl_s=10) == 6
    assert tree.pinned_blocks() == {b0, b1}
    match = tree.match("ns", HEAD + [7, 8, 9])
    table, _ = extend(pool, tree, match, [7, 8, 9])
    tree.unlock(match.handle)
    pool.decref_many(table)
    tree.check_integrity()
    assert tree.pinned_blocks() == {b0, table[1]}
    assert tree.pinned_block_count() == 2 and tree.pinned_tokens() == 6
    assert tree.evict(pool.num_blocks) == 1       # the unpinned tail [6, 9) only
    tree.check_integrity()
    assert node_at(tree, 6).blocks == [b0, table[1]] and tree.evictable_blocks == 2
    clock.now += 11                               # the pin expires
    assert tree.pinned_blocks() == set()
    assert drain(pool, tree) == 2


def test_adoption_below_a_split_head_keeps_parent_and_sibling_shares():
    pool, tree, _, (b0, b1) = build()
    first = tree.match("ns", HEAD + [7, 8])
    table_a, _ = extend(pool, tree, first, [7, 8])
    tree.unlock(first.handle)
    pool.decref_many(table_a)
    # a second continuation: the head's last block is shared with the first one now
    second = tree.match("ns", HEAD + [70, 80, 90])
    table_b, _ = extend(pool, tree, second, [70, 80, 90])
    tree.unlock(second.handle)
    head = node_at(tree, 6)
    assert head.blocks[-1] == table_a[1]          # kept: another child shares it
    assert len(head.children) == 2
    tree.check_integrity([table_b])
    pool.decref_many(table_b)
    tree.check_integrity()
    held = pool.num_blocks - pool.num_free()
    assert tree.evictable_blocks == held
    assert drain(pool, tree) == held


def test_evicting_in_steps_after_adoption_frees_exactly_what_it_reports():
    pool, tree, _, _ = build()
    for tail in ([7, 8, 9, 10, 11], [20, 21], [30, 31, 32, 33, 34, 35, 36]):
        match = tree.match("ns", HEAD + tail)
        table, _ = extend(pool, tree, match, tail)
        tree.unlock(match.handle)
        pool.decref_many(table)
        tree.check_integrity()
    held = pool.num_blocks - pool.num_free()
    assert tree.evictable_blocks == held
    while tree.num_nodes:
        before = pool.num_free()
        freed = tree.evict(1)
        assert freed == pool.num_free() - before
        tree.check_integrity()
        assert tree.evictable_blocks == pool.num_blocks - pool.num_free()
    assert pool.num_free() == pool.num_blocks
