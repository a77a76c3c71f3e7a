"""KVManager without a model: admission (cold, reused, copy-on-write, no room), growth,
insert and release, the window group's holds, loads from a lower tier (an in-memory one
implementing the protocol) and the page-rounded baseline. After every scenario the tree's
integrity holds and every main block is free or held (tree + running tables)."""
from __future__ import annotations

import pytest

from radixgate.kv import WindowSlots
from radixgate.kv.groups.full import FullAttentionGroup
from radixgate.kv.groups.window import WindowGroup
from radixgate.kv.manager import KVManager
from radixgate.kv.page_rounded import PageRoundedKVManager
from radixgate.runtime.engine.api import Request
from radixgate.runtime.engine.sequence import Sequence
from tests.support.kv_fakes import B, compute, conserved, manager, run, seq_of


# -- admission --------------------------------------------------------------------------
def test_a_cold_admission_takes_a_block_per_started_block_and_release_caches_it():
    m, kv = manager()
    seq = seq_of(range(10))
    assert m.admit(seq, m.match(seq))
    assert len(seq.kv.block_table) == 3 and seq.num_computed == 0
    conserved(m, seq)
    compute(m, kv, seq)
    m.release(seq)
    assert seq.kv.block_table == [] and seq.num_computed == 0
    assert m.tree.peek_length("ns", list(range(10))) == 10
    conserved(m)


def test_a_hit_reuses_whole_blocks_and_copies_the_partly_reused_one():
    m, kv = manager()
    run(m, kv, seq_of(range(10)))
    cached = m.tree.match("ns", list(range(10)))
    m.release_match(cached)
    seq = seq_of(list(range(6)) + [99, 98])
    assert m.admit(seq, m.match(seq))
    assert seq.num_computed == 6 and m.hit_tokens["memory"] == 6
    assert seq.kv.block_table[0] == cached.blocks[0]            # shared with the tree
    shared = cached.blocks[1]
    private = seq.kv.block_table[1]
    assert private != shared and kv.copies == [(shared, private, 2)]
    assert kv.contents[private] == (4, 5)
    conserved(m, seq)
    compute(m, kv, seq)
    m.release(seq)
    conserved(m)


def test_the_last_token_is_always_computed():
    m, kv = manager()
    run(m, kv, seq_of(range(8)))
    seq = seq_of(range(8))
    assert m.admit(seq, m.match(seq))
    assert seq.num_computed == 7 and kv.copies[-1][2] == 3
    m.release(seq)
    conserved(m)


def test_no_room_gives_the_match_back_and_leaves_the_sequence_unchanged():
    m, kv = manager(num_blocks=6)
    run(m, kv, seq_of(range(8)))
    hog = seq_of(range(100, 112), rid=1)
    assert m.admit(hog, m.match(hog))                        # 3 of the 4 free blocks
    seq = seq_of(list(range(8)) + list(range(200, 212)), rid=2)
    free = m.pool.num_free()
    assert not m.admit(seq, m.match(seq))
    assert seq.kv.block_table == [] and seq.kv.lock_handle is None and seq.num_computed == 0
    assert m.pool.num_free() == free and len(m.tree.handles) == (hog.kv.lock_handle is not None)
    conserved(m, hog)
    m.release(hog, cache=False)
    conserved(m)


def test_grow_evicts_unlocked_cache_and_keeps_the_table_when_it_cannot():
    m, kv = manager(num_blocks=6)
    run(m, kv, seq_of(range(8)))                              # 2 cached blocks
    seq = seq_of(range(50, 54))
    assert m.admit(seq, None)
    assert m.grow(seq, 20)                                    # 5 blocks: evicts a cached one
    assert len(seq.kv.block_table) == 5 and m.tree.peek_length("ns", list(range(8))) == 4
    assert not m.grow(seq, 28) and len(seq.kv.block_table) == 5  # 7 blocks never fit
    assert m.pool.num_free() == 1
    assert not m.grow_from_free(seq, 24, keep_free=1)
    assert m.grow_from_free(seq, 24) and len(seq.kv.block_table) == 6
    conserved(m, seq)
    m.release(seq, cache=False)
    conserved(m)


def test_insert_prefilled_moves_the_lock_to_the_computed_prefix():
    m, kv = manager()
    seq = seq_of(range(10))
    assert m.admit(seq, m.match(seq))
    compute(m, kv, seq)
    m.insert_prefilled(seq)
    assert seq.kv.lock_handle is not None and m.tree.handles == {seq.kv.lock_handle}
    assert m.tree.freeable_blocks() == 0                      # locked while it runs
    conserved(m, seq)
    m.release(seq)
    conserved(m)
    assert m.tree.freeable_blocks() == 3


def test_may_fit_counts_what_admission_would_allocate():
    m, kv = manager(num_blocks=4)
    run(m, kv, seq_of(range(8)))                              # 2 cached, 2 free
    assert m.may_fit(seq_of(range(16)))                       # reuse 2, allocate 2
    assert m.may_fit(seq_of(range(100, 116)), reuse=False)    # evicts the cache
    assert not m.may_fit(seq_of(range(100, 120)))             # 5 blocks
    conserved(m)


def test_the_page_rounded_baseline_reuses_and_caches_whole_blocks_only():
    m, kv = manager(cls=PageRoundedKVManager)
    seq = seq_of(range(10))
    run(m, kv, seq)
    assert m.tree.peek_length("ns", list(range(10))) == 8     # the partial block stays out
    again = seq_of(list(range(7)) + [50, 51, 52])
    assert m.admit(again, m.match(again))
    assert again.num_computed == 4 and kv.copies == []        # no partial reuse, no copy
    m.release(again)
    conserved(m)


def test_a_plain_model_gets_the_full_group_and_a_windowed_one_both():
    plain, _ = manager()
    assert [type(g) for g in plain.groups] == [FullAttentionGroup] and not plain.holds_per_step
    window = WindowSlots(32, 8, B, 6)
    both, _ = manager(window=window)
    assert [type(g) for g in both.groups] == [FullAttentionGroup, WindowGroup]
    assert both.holds_per_step and both.groups[1].slots is window


# -- a lower tier -----------------------------------------------------------------------
def test_evicted_blocks_go_to_the_tier_and_load_back_on_a_hit():
    m, kv = manager(num_blocks=8, tier_slow=False)
    prompt = list(range(16))
    run(m, kv, seq_of(prompt))
    assert m.tree.evict(4) == 4                                # everything: spilled
    assert len(m.tier.stored) == 4 and m.pool.num_free() == 8
    seq = seq_of(prompt + [77])
    found = m.match(seq)
    assert found.length == 0 and m.admit(seq, found) and seq.kv.tier_load is not None
    assert m.finish_load(seq) and seq.num_computed == 16 and seq.kv.disk_read == 16
    assert [kv.contents[b] for b in seq.kv.block_table[:4]] == [
        tuple(prompt[i:i + 4]) for i in range(0, 16, 4)]
    conserved(m, seq)
    m.release(seq)
    conserved(m)


def test_a_load_extends_a_memory_match_and_is_inserted_once_done():
    m, kv = manager(num_blocks=8, tier_slow=True)
    prompt = list(range(16))
    run(m, kv, seq_of(prompt))
    m.tree.evict(3)                                            # the last 3 blocks go to the tier
    assert m.tree.peek_length("ns", prompt) == 4
    seq = seq_of(prompt + [77])
    assert m.admit(seq, m.match(seq))
    assert seq.kv.tier_load is not None and seq.num_computed == 4
    assert not m.finish_load(seq)                              # still loading
    m.tier.finish(seq.kv.tier_load)
    assert m.finish_load(seq) and seq.kv.tier_load is None
    assert seq.num_computed == 16 and seq.kv.disk_read == 12
    assert m.hit_tokens == {"memory": 4, "disk": 12} and m.tier.hits == 12
    assert [kv.contents[b] for b in seq.kv.block_table[:4]] == [
        tuple(prompt[i:i + 4]) for i in range(0, 16, 4)]
    assert m.tree.peek_length("ns", prompt) == 16
    conserved(m, seq)
    m.release(seq)
    conserved(m)


def test_releasing_a_loading_sequence_cancels_its_load():
    m, kv = manager(num_blocks=8, tier_slow=True)
    prompt = list(range(16))
    run(m, kv, seq_of(prompt))
    m.tree.evict(3)
    seq = seq_of(prompt + [77])
    assert m.admit(seq, m.match(seq))
    job = seq.kv.tier_load
    m.release(seq)
    assert job.cancelled and seq.kv.tier_load is None and seq.kv.block_table == []
    assert m.tree.peek_length("ns", prompt) == 4               # only the memory part
    conserved(m)


def test_long_pins_are_written_through_and_retained():
    m, kv = manager(tier_slow=False)
    prompt = list(range(12))
    run(m, kv, seq_of(prompt))
    assert m.pin_prefix("ns", prompt, 7200.0)
    assert m.tier.retained == {"ns": 7200.0} and len(m.tier.stored) == 3
    assert m.unpin_prefix("ns", prompt) and m.tier.retained == {}
    m.close()
    assert m.tier is None
    conserved(m)


# -- failures give everything back --------------------------------------------------------
class CopyFails(Exception):
    pass


def test_a_failed_copy_on_write_gives_back_the_match_and_the_private_block():
    m, kv = manager()
    run(m, kv, seq_of(range(10)))
    free = m.pool.num_free()

    def fail(pairs, valid_slots):
        raise CopyFails()
    kv.copy_blocks = fail
    seq = seq_of(list(range(6)) + [99])
    with pytest.raises(CopyFails):
        m.admit(seq, m.match(seq))
    assert seq.kv.block_table == [] and seq.kv.lock_handle is None and seq.num_computed == 0
    assert m.pool.num_free() == free
    conserved(m)


def test_the_public_namespace_is_matched_when_the_request_opts_in_and_it_is_longer():
    m, kv = manager()
    run(m, kv, seq_of(range(12), namespace="public"))
    run(m, kv, seq_of(range(4), namespace="ns"))
    plain = seq_of(list(range(12)) + [50])
    assert m.peek_length(plain) == 4
    opted = Sequence(Request(list(range(12)) + [50], namespace="ns", use_public=True), arrival=1)
    assert m.peek_length(opted) == 12
    assert m.admit(opted, m.match(opted)) and opted.num_computed == 12
    conserved(m, opted)
    m.release(opted)
    conserved(m)
