"""RadixTree: token-exact match/insert, splits inside blocks, references and locks."""

import pytest

from radixgate.kv import BlockPool, IntegrityError, RadixTree

B = 4


def make_tree(num_blocks=64):
    pool = BlockPool(num_blocks, B)
    return pool, RadixTree(pool)


def cache(pool, tree, tokens, namespace="ns"):
    """A caller that computes ``tokens`` into fresh blocks, inserts them and drops its refs."""
    blocks = pool.allocate(-(-len(tokens) // B))
    result = tree.insert(namespace, tokens, blocks)
    pool.decref_many(blocks)
    return blocks, result


def release(pool, tree, match):
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)


def test_insert_then_match_returns_exact_length_and_blocks():
    pool, tree = make_tree()
    blocks, result = cache(pool, tree, list(range(10)))
    assert result.cached_before == 0
    match = tree.match("ns", list(range(10)) + [77, 78])
    assert match.length == 10
    assert match.blocks == blocks
    assert match.last_block_partial is True
    tree.check_integrity([match.blocks])
    release(pool, tree, match)
    tree.check_integrity()


def test_match_ending_mid_block_reports_partial_last_block():
    pool, tree = make_tree()
    blocks, _ = cache(pool, tree, list(range(12)))
    match = tree.match("ns", [0, 1, 2, 3, 4, 5, 99])
    assert match.length == 6
    assert match.blocks == blocks[:2]
    assert match.last_block_partial
    release(pool, tree, match)
    whole = tree.match("ns", list(range(8)))
    assert whole.length == 8 and not whole.last_block_partial
    release(pool, tree, whole)


def test_match_gives_caller_a_reference_to_each_block():
    pool, tree = make_tree()
    blocks, _ = cache(pool, tree, list(range(8)))
    match = tree.match("ns", list(range(8)))
    assert [pool.refcount(b) for b in blocks] == [2, 2]
    release(pool, tree, match)
    assert [pool.refcount(b) for b in blocks] == [1, 1]


def test_match_ending_inside_a_node_splits_it_and_locks_only_the_head():
    pool, tree = make_tree()
    blocks, _ = cache(pool, tree, list(range(12)))
    match = tree.match("ns", list(range(5)))
    assert tree.stats().nodes == 2
    assert match.handle.node.end == 5 and match.blocks == blocks[:2]
    tail = match.handle.node.children[5]
    assert tail.lock_ref == 0 and tail.blocks == blocks[1:]
    tree.check_integrity([match.blocks])
    release(pool, tree, match)
    whole = tree.match("ns", list(range(12)))
    assert whole.length == 12                     # the split keeps every token
    release(pool, tree, whole)
    tree.check_integrity()


def test_insert_never_removes_callers_references():
    pool, tree = make_tree()
    blocks = pool.allocate(3)
    tree.insert("ns", list(range(12)), blocks)
    assert [pool.refcount(b) for b in blocks] == [2, 2, 2]
    again = tree.insert("ns", list(range(12)), blocks)
    assert again.cached_before == 12
    assert [pool.refcount(b) for b in blocks] == [2, 2, 2]
    tree.check_integrity([blocks])


def test_insert_existing_nodes_keep_their_blocks():
    pool, tree = make_tree()
    first, _ = cache(pool, tree, list(range(8)))
    duplicate = pool.allocate(3)
    result = tree.insert("ns", list(range(12)), duplicate)
    assert result.cached_before == 8
    match = tree.match("ns", list(range(12)))
    assert match.blocks == first + [duplicate[2]]
    assert pool.refcount(duplicate[0]) == 1  # only the caller's reference
    tree.check_integrity([duplicate, match.blocks])


def test_split_inside_block_shares_block_with_two_refs():
    pool, tree = make_tree()
    blocks, _ = cache(pool, tree, list(range(10)))       # blocks for [0,4) [4,8) [8,10)
    own = pool.allocate(2)
    tree.insert("ns", [0, 1, 2, 3, 4, 5, 70, 71], own)    # diverges at 6, inside block 1
    pool.decref_many(own)
    assert pool.refcount(blocks[1]) == 2                  # upper [0,6) and lower [6,10)
    assert pool.refcount(own[1]) == 1                     # the new leaf [6,8)
    assert pool.refcount(own[0]) == 0                     # block 0 was cached already
    assert tree.stats().nodes == 3
    tree.check_integrity()


def test_block_at_boundary_comes_from_deepest_node():
    pool, tree = make_tree()
    cache(pool, tree, list(range(10)))
    own = pool.allocate(2)
    tree.insert("ns", [0, 1, 2, 3, 4, 5, 70, 71], own)
    match = tree.match("ns", [0, 1, 2, 3, 4, 5, 70, 71])
    assert match.length == 8
    assert match.blocks[1] == own[1]
    tree.check_integrity([own, match.blocks])


def test_extending_a_leaf_inside_its_last_block_keeps_one_copy_of_that_block():
    pool, tree = make_tree(16)
    first, _ = cache(pool, tree, list(range(6)))          # [0,4) [4,6): block 1 partial
    match = tree.match("ns", list(range(10)))
    assert (match.length, match.last_block_partial) == (6, True)
    copy, tail = pool.allocate(2)                          # copy-on-write of block 1, then [8,10)
    tree.insert("ns", list(range(10)), [first[0], copy, tail])
    release(pool, tree, match)
    pool.decref_many([copy, tail])
    assert tree.held_blocks() == {first[0], copy, tail}    # the old partial block went back
    assert pool.num_free() == 16 - 3
    tree.check_integrity()
    again = tree.match("ns", list(range(6)) + [99])        # the first prompt is still whole
    assert (again.length, again.blocks) == (6, [first[0], copy])
    release(pool, tree, again)
    tree.check_integrity()


def test_extension_keeps_a_partial_block_that_another_node_shares():
    pool, tree = make_tree(16)
    first, _ = cache(pool, tree, list(range(10)))
    cache(pool, tree, [0, 1, 2, 3, 4, 5, 70, 71])          # split at 6: block 1 in two nodes
    branch = pool.allocate(3)
    tree.insert("ns", [0, 1, 2, 3, 4, 5, 80, 81, 82], branch)   # extends the upper [0,6)
    pool.decref_many(branch)
    assert first[1] in tree.held_blocks()                  # still the lower half's block
    match = tree.match("ns", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert match.blocks[1] == first[1] and match.length == 10
    release(pool, tree, match)
    tree.check_integrity()


def test_split_new_parent_inherits_lock_count():
    pool, tree = make_tree()
    cache(pool, tree, list(range(10)))
    match = tree.match("ns", list(range(10)))
    blocks = pool.allocate(2)
    tree.insert("ns", [0, 1, 2, 3, 4, 5, 70], blocks)
    assert tree.stats().locked_tokens == 10               # upper [0,6) and lower [6,10)
    tree.check_integrity([match.blocks, blocks])
    release(pool, tree, match)
    pool.decref_many(blocks)
    assert tree.stats().locked_tokens == 0
    tree.check_integrity()


def test_insert_with_lock_locks_node_ending_at_tokens_end():
    pool, tree = make_tree()
    cache(pool, tree, list(range(10)))
    blocks = pool.allocate(2)
    result = tree.insert("ns", list(range(7)), blocks, lock=True)
    assert result.cached_before == 7
    assert result.handle.node.end == 7
    assert tree.stats().locked_tokens == 7
    assert tree.evict(100) == 1                           # only the unlocked tail [7,10)
    tree.unlock(result.handle)
    pool.decref_many(blocks)
    tree.check_integrity()


def test_insert_too_few_blocks_raises():
    pool, tree = make_tree()
    with pytest.raises(ValueError, match="need 3 blocks"):
        tree.insert("ns", list(range(9)), pool.allocate(2))


def test_namespaces_never_cross():
    pool, tree = make_tree()
    cache(pool, tree, list(range(8)), namespace="tenant-a")
    match = tree.match("tenant-b", list(range(8)))
    assert match.length == 0 and match.blocks == []
    release(pool, tree, match)
    assert tree.stats().namespaces["tenant-a"].cached_tokens == 8
    assert "tenant-b" not in tree.stats().namespaces      # nothing cached: dropped again


def test_unlock_twice_raises():
    pool, tree = make_tree()
    cache(pool, tree, list(range(4)))
    match = tree.match("ns", list(range(4)))
    tree.unlock(match.handle)
    with pytest.raises(ValueError, match="unlocked twice"):
        tree.unlock(match.handle)


def test_lock_on_handle_adds_a_second_lock():
    pool, tree = make_tree()
    cache(pool, tree, list(range(4)))
    match = tree.match("ns", list(range(4)))
    tree.lock(match.handle)
    tree.unlock(match.handle)
    assert tree.evict(10) == 0
    tree.unlock(match.handle)
    pool.decref_many(match.blocks)
    assert tree.evict(10) == 1


def test_stats_count_queries_and_hits_per_namespace():
    pool, tree = make_tree()
    cache(pool, tree, list(range(8)))
    for query in ([0, 1, 2], [0, 1, 9, 9], [5]):
        release(pool, tree, tree.match("ns", query))
    ns = tree.stats().namespaces["ns"]
    assert (ns.queries, ns.query_tokens, ns.hit_tokens) == (3, 8, 5)


def test_integrity_check_catches_unreported_holder():
    pool, tree = make_tree()
    cache(pool, tree, list(range(8)))
    match = tree.match("ns", list(range(8)))
    with pytest.raises(IntegrityError, match="refcount 2, holders recounted 1"):
        tree.check_integrity()
    tree.check_integrity([match.blocks])


def test_integrity_check_catches_corrupted_counter():
    pool, tree = make_tree()
    cache(pool, tree, list(range(8)))
    tree.evictable_tokens += 1
    with pytest.raises(IntegrityError, match="evictable_tokens"):
        tree.check_integrity()


def test_top_prefixes_lists_hottest_paths_with_tokens():
    pool, tree = make_tree()
    cache(pool, tree, [1, 2, 3, 4, 5, 6])
    cache(pool, tree, [1, 2, 3, 9, 9])
    for _ in range(3):
        release(pool, tree, tree.match("ns", [1, 2, 3, 4, 5, 6]))
    release(pool, tree, tree.match("ns", [1, 2, 3, 9]))
    top = tree.top_prefixes(2)
    assert [(p.tokens, p.hits) for p in top] == [((1, 2, 3), 4), ((1, 2, 3, 4, 5, 6), 3)]
    assert top[0].namespace == "ns" and top[0].owner == "" and top[0].pin_ttl_s == 0.0


def test_peek_length_reads_without_locking_or_counting():
    pool, tree = make_tree()
    blocks, _ = cache(pool, tree, list(range(10)))
    assert tree.peek_length("ns", [0, 1, 2, 3, 4, 5, 6, 99]) == 7
    assert tree.peek_length("other", [0, 1]) == 0
    stats = tree.stats()
    assert stats.locked_tokens == 0 and stats.namespaces["ns"].queries == 0
    assert pool.refcount(blocks[0]) == 1


def test_array_tokens_match_the_same_as_lists():
    from array import array

    from radixgate.kv import token_array

    pool, tree = make_tree()
    blocks, _ = cache(pool, tree, [5, 6, 7, 8, 9, 10])
    match = tree.match("ns", token_array([5, 6, 7, 8, 9, 11]))
    assert match.length == 5 and match.blocks == blocks
    release(pool, tree, match)
    assert token_array([1, 2]) == array("i", [1, 2])
    result = tree.insert("ns", array("i", [5, 6, 7, 8, 1]), blocks[:1] + pool.allocate(1))
    assert result.cached_before == 4
