"""BlockPool: allocation, refcounts, and loud failures on reference-counting mistakes."""

import pytest

from radixgate.kv import BlockPool, BlockPoolError, OutOfBlocks


def test_allocate_hands_out_distinct_blocks_with_one_reference():
    pool = BlockPool(8, 16)
    blocks = pool.allocate(5)
    assert len(set(blocks)) == 5
    assert all(pool.refcount(b) == 1 for b in blocks)
    assert pool.num_free() == 3


def test_allocate_more_than_free_raises_out_of_blocks_and_takes_nothing():
    pool = BlockPool(4, 16)
    pool.allocate(3)
    with pytest.raises(OutOfBlocks, match="need 2 blocks but only 1"):
        pool.allocate(2)
    assert pool.num_free() == 1
    assert pool.can_allocate(1) and not pool.can_allocate(2)


def test_last_decref_returns_block_to_free_list():
    pool = BlockPool(2, 16)
    (block,) = pool.allocate(1)
    pool.incref(block)
    assert pool.decref(block) is False
    assert pool.num_free() == 1
    assert pool.decref(block) is True
    assert pool.num_free() == 2
    assert block in pool.free_blocks()


def test_double_free_raises_clear_error():
    pool = BlockPool(2, 16)
    (block,) = pool.allocate(1)
    pool.decref(block)
    with pytest.raises(BlockPoolError, match="double free"):
        pool.decref(block)
    assert pool.num_free() == 2


def test_incref_of_free_block_raises():
    pool = BlockPool(2, 16)
    with pytest.raises(BlockPoolError, match="incref of free block 1"):
        pool.incref(1)


def test_unknown_block_id_raises():
    pool = BlockPool(2, 16)
    for bad in (-1, 2, "0"):
        with pytest.raises(BlockPoolError, match="unknown block"):
            pool.decref(bad)


def test_incref_many_is_all_or_nothing():
    pool = BlockPool(4, 16)
    a, b = pool.allocate(2)
    with pytest.raises(BlockPoolError):
        pool.incref_many([a, b, 3])
    assert pool.refcount(a) == 1 and pool.refcount(b) == 1


def test_freed_blocks_are_reused():
    pool = BlockPool(2, 16)
    first = pool.allocate(2)
    pool.decref_many(first)
    assert sorted(pool.allocate(2)) == sorted(first)


def test_invalid_sizes_rejected():
    with pytest.raises(ValueError):
        BlockPool(4, 0)
    with pytest.raises(ValueError):
        BlockPool(-1, 16)


def test_bulk_operations_reject_bad_blocks_with_pool_errors():
    pool = BlockPool(4, 16)
    a, b = pool.allocate(2)
    with pytest.raises(BlockPoolError, match="unknown block"):
        pool.incref_many([a, "1"])
    with pytest.raises(BlockPoolError, match="unknown block"):
        pool.decref_many([7])
    assert pool.decref_many([a, b]) == 2
    with pytest.raises(BlockPoolError, match="double free"):
        pool.decref_many([a])
