"""radixgate/kv/events/wire.py: the one definition of vLLM's KV event format. What the
publisher encodes, the router decodes back into the same records, for every kind of event
and both media; the bytes are those radixgate has always sent."""
from __future__ import annotations

import msgpack
import pytest

from radixgate.kv import BlockPool, CacheEvent, RadixTree
from radixgate.kv.core.events import EventFanout
from radixgate.kv.events.blocks import BlockTracker, hash_seed
from radixgate.kv.events.wire import (DEFAULT_MEDIUM, WINDOW_MEDIUM, AllBlocksCleared,
                                      BlockRemoved, BlockStored, KVDecodeError, decode_batch,
                                      decode_event, encode_batch)

B = 4
EVERY_KIND = [AllBlocksCleared(),
              BlockStored((11, -12), None, (1, 2, 3, 4, 5, 6, 7, 8), B),
              BlockStored((13,), -12, (9, 10, 11, 12), B),
              BlockRemoved((11,)),
              BlockRemoved((13,), WINDOW_MEDIUM)]
# encode_batch(EVERY_KIND, ts=12.5, rank=0) as radixgate/kv/events/publisher.py sent it
# before the format moved here (commit 7a2651a): the wire must not change.
SENT_BEFORE = bytes.fromhex(
    "93cb40290000000000009591b0416c6c426c6f636b73436c656172656498ab426c6f636b53746f726564"
    "920bf4c098010203040506070804c0a3475055c098ab426c6f636b53746f726564910df494090a0b0c04"
    "c0a3475055c093ac426c6f636b52656d6f766564910ba347505593ac426c6f636b52656d6f766564910d"
    "aa4750555f57494e444f5700")


@pytest.mark.parametrize("event", EVERY_KIND, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("rank", [None, 0, 3])
def test_every_kind_comes_back_as_it_went(event, rank):
    assert decode_batch(encode_batch([event], ts=2.5, rank=rank)) == (2.5, [event], rank)


def test_a_batch_comes_back_whole_and_in_order():
    ts, events, rank = decode_batch(encode_batch(EVERY_KIND, ts=12.5, rank=0))
    assert (ts, events, rank) == (12.5, EVERY_KIND, 0)


def test_the_bytes_are_the_ones_sent_before():
    assert encode_batch(EVERY_KIND, ts=12.5, rank=0) == SENT_BEFORE


def test_the_window_medium_survives_and_any_other_medium_is_the_main_pool():
    window = BlockRemoved((5, 6), WINDOW_MEDIUM)
    raw = msgpack.unpackb(encode_batch([window, BlockRemoved((7,))], ts=1.0, medium="CPU"))
    assert raw[1] == [["BlockRemoved", [5, 6], WINDOW_MEDIUM], ["BlockRemoved", [7], "CPU"]]
    assert decode_batch(encode_batch([window], ts=1.0))[1] == [window]
    assert decode_event(["BlockRemoved", [7], DEFAULT_MEDIUM]) == BlockRemoved((7,))
    assert decode_event(["BlockRemoved", [7], "CPU"]) == BlockRemoved((7,))


def test_a_stored_event_carries_vllms_fields_in_declaration_order():
    stored = EVERY_KIND[2]
    assert stored.to_wire(DEFAULT_MEDIUM) == ["BlockStored", [13], -12, [9, 10, 11, 12], B,
                                              None, DEFAULT_MEDIUM, None]


def test_unknown_kinds_and_later_fields_are_skipped_and_a_non_batch_is_an_error():
    newer = msgpack.packb([1.0, [["BlockMigrated", [1], "peer"], [["odd"]],
                                 ["BlockStored", [1], None, [1, 2, 3, 4], B, None, "GPU", None,
                                  None, 0, "full_attention", None]]], use_bin_type=True)
    assert decode_batch(newer) == (1.0, [BlockStored((1,), None, (1, 2, 3, 4), B)], None)
    for payload in (b"\xc1", msgpack.packb(3), msgpack.packb([1.0, [{"type": "BlockStored"}]])):
        with pytest.raises(KVDecodeError):
            decode_batch(payload)


def test_what_the_tracker_makes_of_a_tree_comes_back_from_the_wire():
    """A tree's events through the tracker, the encoder and the decoder: the decoded
    records are the tracker's, and its snapshot decodes to the same blocks."""
    tracker = BlockTracker(hash_seed("m", "float32", B), B)
    made: list = []
    events = EventFanout()
    events.subscribe(lambda e: made.append(tracker.convert(e)))
    pool = BlockPool(16, B)
    tree = RadixTree(pool, on_event=events)
    for tokens in ([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23]):
        blocks = pool.allocate(-(-len(tokens) // B))
        tree.insert("ns", tokens, blocks)
        pool.decref_many(blocks)
    events(CacheEvent("window_removed", "", (0,), 0, 0, "window"))
    tree.flush()
    tree.check_integrity()
    made = [e for e in made if e is not None]
    assert {type(e) for e in made} == {BlockStored, BlockRemoved}
    assert decode_batch(encode_batch(made, ts=3.0))[1] == made
    snapshot = tracker.snapshot()
    assert decode_batch(encode_batch(snapshot, ts=3.0))[1] == snapshot == [AllBlocksCleared()]


# ---------------------------------------------------------------- the tree's fan-out

def _cache(pool, tree, tokens) -> None:
    blocks = pool.allocate(-(-len(tokens) // B))
    tree.insert("ns", tokens, blocks)
    pool.decref_many(blocks)


def test_the_fanout_hands_each_event_to_every_subscriber_in_order():
    seen: list = []
    events = EventFanout(lambda e: seen.append(("first", e.kind)))
    events.subscribe(lambda e: seen.append(("second", e.kind)))
    pool = BlockPool(8, B)
    tree = RadixTree(pool, on_event=events)
    _cache(pool, tree, [1, 2, 3, 4, 5])
    tree.flush()
    tree.check_integrity()
    assert seen == [("first", "stored"), ("second", "stored"),
                    ("first", "removed"), ("second", "removed")]


def test_a_tree_whose_fanout_has_no_subscriber_builds_no_event(monkeypatch):
    from radixgate.kv.core import tree as tree_module
    built: list = []
    monkeypatch.setattr(tree_module, "CacheEvent", lambda *a, **k: built.append(a))
    events = EventFanout()
    pool = BlockPool(8, B)
    tree = RadixTree(pool, on_event=events)
    _cache(pool, tree, [1, 2, 3, 4, 5])
    assert not events and built == []
    seen: list = []
    events.subscribe(seen.append)                     # a late subscriber sees what follows
    tree.flush()
    tree.check_integrity()
    assert events and len(built) == len(seen) == 1
