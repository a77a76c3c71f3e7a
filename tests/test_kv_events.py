"""KV events: the tree's CacheEvents as vLLM's BlockStored / BlockRemoved / AllBlocksCleared,
addressed by chained content hashes, encoded as vLLM's msgpack KVEventBatch."""
from __future__ import annotations

import msgpack
import pytest

from radixgate.cluster.kv_decode import decode_batch
from radixgate.radix_cache import BlockPool, RadixTree
from radixgate.radix_cache.block_hash import as_event_id, block_hashes, root_hash
from radixgate.radix_cache.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,
                                             BlockTracker, prompt_block_ids)
from radixgate.runtime.kv_events import (EndpointError, check_endpoint, encode_batch,
                                         hash_seed)

B = 4
SEED = hash_seed("m", "float32", B)


class Recorder:
    """A tree whose events go through a BlockTracker into a list."""

    def __init__(self, num_blocks: int = 32):
        self.tracker = BlockTracker(SEED, B)
        self.events: list = []
        self.pool = BlockPool(num_blocks, B)
        self.tree = RadixTree(self.pool, on_event=self._on_event)

    def _on_event(self, event) -> None:
        converted = self.tracker.convert(event)
        if converted is not None:
            self.events.append(converted)

    def cache(self, namespace: str, tokens: list[int]) -> None:
        """A request's flow: match, allocate the rest (copying a partial block), insert,
        drop the request's references."""
        match = self.tree.match(namespace, tokens)
        keep = match.length // B
        self.pool.decref_many(match.blocks[keep:])
        blocks = list(match.blocks[:keep]) + self.pool.allocate(-(-len(tokens) // B) - keep)
        self.tree.insert(namespace, tokens, blocks)
        self.tree.unlock(match.handle)
        self.pool.decref_many(blocks)
        self.tree.check_integrity()


def ids(namespace: str, tokens: list[int]) -> list[int]:
    return [as_event_id(h) for h in block_hashes(root_hash(SEED, namespace), tokens, B)]


def test_full_blocks_are_announced_by_chained_hash_and_the_partial_tail_is_not():
    rec = Recorder()
    tokens = list(range(100, 110))                       # 2 full blocks + 2 tokens
    rec.cache("ns", tokens)
    assert rec.events == [BlockStored(tuple(ids("ns", tokens)), None, tuple(tokens[:8]), B)]
    assert len(ids("ns", tokens)) == 2


def test_an_extension_names_its_parent_block_and_only_new_full_blocks():
    rec = Recorder()
    first, longer = list(range(10)), list(range(10)) + [50, 51, 52, 53, 54, 55]
    rec.cache("ns", first)
    rec.cache("ns", longer)
    chain = ids("ns", longer)                            # 4 full blocks
    stored = rec.events[-1]
    assert stored == BlockStored(tuple(chain[2:4]), chain[1], tuple(longer[8:16]), B)


def test_block_hashes_depend_on_the_namespace():
    rec = Recorder()
    tokens = list(range(8))
    rec.cache("tenant-a", tokens)
    rec.cache("tenant-b", tokens)
    a, b = rec.events
    assert set(a.block_hashes).isdisjoint(b.block_hashes)
    assert list(a.block_hashes) == prompt_block_ids(SEED, "tenant-a", tokens, B)


def test_a_flush_removes_exactly_what_was_announced():
    rec = Recorder(num_blocks=6)
    rec.cache("ns", list(range(12)))                     # 3 blocks
    rec.cache("ns", list(range(50, 62)))                 # 3 more: the pool is full
    rec.tree.flush()
    removed = [h for e in rec.events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    stored = [h for e in rec.events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert sorted(removed) == sorted(stored) and len(stored) == 6
    assert rec.tracker.num_announced == 0
    rec.tree.check_integrity()


def test_a_split_inside_a_block_keeps_each_hash_announced_once():
    rec = Recorder()
    rec.cache("ns", list(range(8)))
    rec.cache("ns", list(range(6)) + [90, 91, 92, 93])   # splits the first node at 6
    stored = [h for e in rec.events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert len(stored) == len(set(stored)) == 3
    rec.tree.flush()
    removed = [h for e in rec.events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert sorted(removed) == sorted(stored)


def test_the_batch_has_vllms_msgpack_structure():
    events = [BlockStored((1, -2), None, (5, 6, 7, 8, 9, 10, 11, 12), B),
              BlockRemoved((3,)), AllBlocksCleared()]
    raw = msgpack.unpackb(encode_batch(events, ts=12.5, rank=0))
    assert raw == [12.5, [["BlockStored", [1, -2], None, [5, 6, 7, 8, 9, 10, 11, 12], B, None,
                           "GPU", None],
                          ["BlockRemoved", [3], "GPU"],
                          ["AllBlocksCleared"]], 0]
    ts, decoded, rank = decode_batch(encode_batch(events, ts=12.5, rank=0))
    assert (ts, decoded, rank) == (12.5, events, 0)


def test_event_ids_are_signed_64_bit():
    tokens = list(range(64))
    for event_id in prompt_block_ids(SEED, "ns", tokens, B):
        assert -(1 << 63) <= event_id < (1 << 63)


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:5557", "tcp://localhost:*",
                                      "tcp://[::1]:6000", "ipc:///tmp/x"])
def test_loopback_endpoints_are_accepted(endpoint):
    assert check_endpoint(endpoint) == endpoint


@pytest.mark.parametrize("endpoint", ["tcp://0.0.0.0:5557", "tcp://*:5557", "tcp://10.0.0.2:1"])
def test_other_hosts_need_an_explicit_allow(endpoint):
    with pytest.raises(EndpointError, match="loopback"):
        check_endpoint(endpoint)
    assert check_endpoint(endpoint, allow_remote=True) == endpoint


@pytest.mark.parametrize("endpoint", ["127.0.0.1:5557", "tcp://127.0.0.1", "http://x:1"])
def test_malformed_endpoints_are_refused(endpoint):
    with pytest.raises(EndpointError):
        check_endpoint(endpoint)
