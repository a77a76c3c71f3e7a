"""The window group (kv/groups/window.py) through the KVManager: what a sequence holds of the
window layers' pool while it runs, what a hit holds and copies, tombstones announced and
backed off from, pinned prefixes' ends spared. Both pools are recounted after each step."""
from __future__ import annotations

import pytest

from radixgate.kv import WindowSlots
from radixgate.kv.manager import KVManager
from tests.support.kv_fakes import B, FakeKV, compute, conserved, main_pool, manager, seq_of, \
    tree_over

W = 6


def window_manager(num_main: int = 32, num_window: int = 8, events=None):
    window = WindowSlots(num_main, num_window, B, W)
    return manager(num_main, window=window, events=events)


def test_the_window_group_holds_what_the_window_reads_and_lets_go_of_the_rest():
    m, kv = window_manager()
    window = kv.window
    seq = seq_of(range(30))
    assert m.admit(seq, None) and seq.kv.window_held == {}
    for end in (4, 8, 12, 16, 20, 24, 28, 30):
        assert m.reserve(seq, end)
        compute(m, kv, seq, end)
        conserved(m, seq)
    assert sorted(seq.kv.window_held) == [5, 6, 7]               # positions 24.. and the last
    assert window.pool.num_free() == 8 - 3
    m.release(seq)
    assert seq.kv.window_held == {}
    conserved(m)
    assert len(window.kept) == 3                               # the tree keeps what it had


def test_a_hit_holds_the_window_of_its_end_and_copies_its_window_data():
    m, kv = window_manager()
    first = seq_of(range(16))
    assert m.admit(first, None)
    for end in (4, 8, 12, 16):
        assert m.reserve(first, end)
        compute(m, kv, first, end)
    m.release(first)
    seq = seq_of(list(range(14)) + [90])
    assert m.admit(seq, m.match(seq))
    assert seq.num_computed == 14 and sorted(seq.kv.window_held) == [2, 3]
    private = seq.kv.block_table[3]
    assert kv.copies and kv.copies[-1][1] == private and kv.window.has(private)
    conserved(m, seq)
    m.release(seq)
    conserved(m)


def test_a_tombstoned_window_backs_the_reuse_off_and_is_announced():
    events = []
    m, kv = window_manager(num_window=4, events=events.append)
    first = seq_of(range(24))
    assert m.admit(first, None)
    for end in range(4, 25, 4):
        assert m.reserve(first, end)
        compute(m, kv, first, end)
    first_table = list(first.kv.block_table)
    m.release(first)
    before = len(events)
    other = seq_of(range(100, 124), rid=1)                     # needs the window pool
    assert m.admit(other, None)
    for end in range(4, 25, 4):
        assert m.reserve(other, end)
        compute(m, kv, other, end)
        conserved(m, other)
    announced = [b for e in events[before:] if e.kind == "window_removed" for b in e.blocks]
    assert set(announced) & set(first_table)                  # tombstoned by the eviction
    m.release(other)
    seq = seq_of(list(range(24)) + [7], rid=2)
    found = m.match(seq)
    assert found.length == 24
    assert m.admit(seq, found)
    assert seq.num_computed < 24                               # backed off below the gap
    conserved(m, seq)
    m.release(seq)
    conserved(m)


def test_a_pinned_prefix_keeps_the_window_data_its_end_reads():
    m, kv = window_manager(num_window=4)
    first = seq_of(range(12))
    assert m.admit(first, None)
    for end in (4, 8, 12):
        assert m.reserve(first, end)
        compute(m, kv, first, end)
    m.release(first)
    assert m.pin_prefix("ns", list(range(12)), 60.0)
    other = seq_of(range(100, 124), rid=1)
    assert m.admit(other, None)
    for end in range(4, 25, 4):
        if not m.reserve(other, end):
            break
        compute(m, kv, other, end)
    pinned_end = m.tree.match("ns", list(range(12)))
    m.release_match(pinned_end)
    assert all(kv.window.has(b) for b in kv.window.needed(pinned_end.blocks, 12, 12))
    m.release(other)
    conserved(m)


def test_a_window_pool_needs_the_main_pool_wired_to_it():
    window = WindowSlots(8, 4, B, W)
    kv = FakeKV(8, B, window)
    with pytest.raises(ValueError):
        KVManager(tree_over(main_pool(8, B)), main_pool(8, B), kv)
