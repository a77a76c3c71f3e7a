"""The window layers' pool (kv.WindowSlots) and the budget split (window_plan):
refcounts per holder, tombstones, the usable-reuse back-off, eviction order, integrity."""
import pytest

from radixgate.kv import BlockPool, OutOfBlocks, WindowSlots
from radixgate.kv.groups.window_plan import (min_window_blocks, split_for_count, split_pool,
                                               window_geometry)

B, W = 4, 6


def slots(num_main: int = 16, num_window: int = 6) -> WindowSlots:
    return WindowSlots(num_main, num_window, B, W)


def test_hold_gives_fresh_ids_and_drop_tombstones_the_last_holder():
    s = slots()
    s.hold([3, 5])
    assert s.has(3) and s.has(5) and not s.has(4)
    s.hold([3])                                   # a second holder of block 3's window data
    s.drop([3])
    assert s.has(3)
    s.drop([3, 5])
    assert not s.has(3) and not s.has(5) and s.pool.num_free() == 6
    with pytest.raises(ValueError):
        s.drop([3])


def test_hold_is_all_or_nothing():
    s = slots(num_window=2)
    s.hold([0])
    with pytest.raises(OutOfBlocks):
        s.hold([0, 1, 2])                         # two fresh ids, one free
    assert s.pool.refcount(s.window_id(0)) == 1 and not s.has(1) and not s.has(2)


def test_the_tree_keeps_window_data_until_evicted_or_freed():
    s = slots()
    main = BlockPool(16, B, on_free=s.on_main_free)
    blocks = main.allocate(3)
    s.hold(blocks)
    s.keep(blocks)                                # the tree caches them
    s.drop(blocks)                                # the sequence moves on
    assert all(s.has(b) for b in blocks) and s.pool.num_free() == 3
    s.touch([blocks[0]])                          # a match used block 0: evicted last
    assert s.evict(5) == blocks[1:] and s.has(blocks[0]) and not s.has(blocks[1])
    main.decref(blocks[0])                        # the tree evicts the main block too
    assert not s.has(blocks[0]) and s.pool.num_free() == 6 and not s.kept


def test_eviction_spares_running_holders_and_protected_blocks():
    s = slots()
    s.hold([1, 2, 3])
    s.keep([1, 2, 3])
    s.drop([1, 3])                                # a sequence still holds block 2
    # a pinned prefix's end reads block 1
    assert s.evict(6, protected={1}) == [3]
    assert s.has(1) and s.has(2) and not s.has(3)


@pytest.mark.parametrize("present, length, usable", [
    (range(0, 8), 30, 30),          # everything has window data
    ([6, 7], 30, 30),               # the first query (30) reads 25..29 only: blocks 6, 7
    ([6, 7], 26, 0),                # 26 reads 21..25 (block 5 gone), 20 reads block 4 ...
    ([0, 1, 2, 6, 7], 22, 12),      # the nearest point whose keys (7..11) lie in blocks 1, 2
    ([1, 2], 30, 12),
    ([3], 30, 0),                   # nothing usable: recompute from 0
    ([], 1, 0),
])
def test_usable_reuse_backs_off_to_the_nearest_point_whose_window_is_whole(present, length,
                                                                          usable):
    s = slots(num_window=8)
    table = list(range(8))
    s.hold([table[i] for i in present])
    assert s.usable_reuse(table, length) == usable
    lo = max(0, usable - W + 1) // B
    assert all(s.has(table[i]) for i in range(lo, -(-usable // B)))


def test_integrity_counts_every_holder():
    s = slots()
    s.hold([1, 2])
    s.keep([2])
    s.check({2}, [[1, 2]])
    with pytest.raises(AssertionError, match="refcount"):
        s.check({2}, [[1]])                       # a hold nobody accounts for
    with pytest.raises(AssertionError, match="tree lacks"):
        s.check(set(), [[1, 2]])


def test_window_geometry_and_the_split():
    assert window_geometry([0, 0]) is None
    assert window_geometry([8, 0, 8]) == (8, (0, 2))
    assert window_geometry([8, 16]) is None                  # two windows: counted in full
    layer = 1024                                             # one layer's block
    gemma3 = [1024] * 5 + [0]
    split = split_pool(600 * 6 * layer, layer, 6, gemma3, block_size=16, context=32768,
                       step_tokens=512)
    assert split.pooled and split.window == 1024 and split.window_layers == (0, 1, 2, 3, 4)
    used = split.main_blocks * layer + split.window_blocks * 5 * layer
    assert used <= 600 * 6 * layer and split.main_blocks > 1.7 * 600   # auto: 1/2 of it
    assert split.window_blocks >= min_window_blocks(1024, 512, 16)
    lean = split_pool(600 * 6 * layer, layer, 6, gemma3, block_size=16, context=32768,
                      step_tokens=512, ratio=0.1)
    assert lean.main_blocks > 3 * 600 and lean.window_blocks == -(-lean.main_blocks // 10)
    assert not split_pool(600 * layer, layer, 6, gemma3, block_size=16, context=1024,
                          step_tokens=512).pooled                     # window >= context
    assert not split_pool(600 * layer, layer, 6, gemma3, block_size=16, context=32768,
                          step_tokens=512, ratio=1.0).pooled
    mistral = split_pool(1000 * 4 * layer, layer, 4, [4096] * 4, block_size=16, context=32768,
                         step_tokens=512, ratio=0.5)
    assert mistral.window_blocks == 1000 and mistral.main_blocks == 2000
    assert split_for_count(64, [8, 0], block_size=16, context=512, step_tokens=16,
                           window_blocks=6).window_blocks == 6
    assert not split_for_count(64, [8, 0], block_size=16, context=512, step_tokens=2048).pooled


def test_a_block_moves_between_caches_with_its_window_part_only_where_it_has_one():
    """KVCache with a window pool: whole blocks gather and write back (the tier's path);
    main block 4 is numbered like the window pool's trash block and still travels."""
    import torch

    from radixgate.kv.groups.window_plan import PoolSplit
    from radixgate.runtime.model.kv_cache import KVCache
    kv = KVCache(2, 8, B, 2, 3, "float32", "cpu", PoolSplit(8, 4, W, (0,), 0.5))
    assert kv.window.trash == 4 and kv.part_layers() == [1, 1, 1, 1]
    for tensor in kv._tensors:
        tensor.copy_(torch.randn_like(tensor))
    kv.k[0][kv.window.trash].zero_()                  # never written (WindowSlots.trash)
    kv.v[0][kv.window.trash].zero_()
    kv.window.hold([1])
    parts = kv.gather_blocks([1, 2])                  # block 2: a tombstone (zeros)
    assert not parts[2][1].any()
    kv.window.hold([4])
    for block, i in ((4, 0), (5, 1)):
        kv.write_block(block, [p[i] for p in parts], B)
    assert torch.equal(kv.k[1][4], kv.k[1][1]) and torch.equal(kv.k[1][5], kv.k[1][2])
    assert torch.equal(kv.k[0][kv.window.window_id(4)], kv.k[0][kv.window.window_id(1)])
    assert not kv.window.has(5)                       # no window data written for it
