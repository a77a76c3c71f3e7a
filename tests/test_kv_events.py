"""KV events: the tree's CacheEvents as vLLM's BlockStored / BlockRemoved / AllBlocksCleared,
addressed by chained content hashes, encoded as vLLM's msgpack KVEventBatch."""
from __future__ import annotations

import threading
import time

import msgpack
import pytest

from radixgate.kv import BlockPool, RadixTree
from radixgate.kv.core.block_hash import as_event_id, block_hashes, root_hash
from radixgate.kv.events.blocks import BlockTracker, hash_seed, prompt_block_ids
from radixgate.kv.events.publisher import EndpointError, check_endpoint
from radixgate.kv.events.wire import (AllBlocksCleared, BlockRemoved, BlockStored,
                                      decode_batch, encode_batch)

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


def test_window_data_let_go_is_a_removal_in_the_window_group_only():
    """A model with window layers: blocks whose window-layer K/V the window pool let go are
    announced as ``BlockRemoved`` with medium ``GPU_WINDOW`` (once; the snapshot repeats
    it); they stay announced for the main pool until it evicts them, and the router's
    prefix index keeps them."""
    from radixgate.cluster.prefix_index import PrefixIndex
    from radixgate.kv import CacheEvent
    from radixgate.kv.events.wire import WINDOW_MEDIUM
    rec = Recorder()
    tokens = list(range(100, 112))                       # blocks 0, 1, 2
    rec.cache("ns", tokens)
    blocks = rec.tree.match("ns", tokens)
    rec.tree.unlock(blocks.handle)
    rec.pool.decref_many(blocks.blocks)
    for _ in range(2):                                   # the second time: nothing new
        rec._on_event(CacheEvent("window_removed", "", tuple(blocks.blocks[:2]), 0, 0, "window"))
    window = [e for e in rec.events if isinstance(e, BlockRemoved)]
    assert window == [BlockRemoved(tuple(ids("ns", tokens)[:2]), WINDOW_MEDIUM)]
    raw = msgpack.unpackb(encode_batch(window, ts=1.0))
    assert raw[1] == [["BlockRemoved", ids("ns", tokens)[:2], WINDOW_MEDIUM]]
    assert decode_batch(encode_batch(window, ts=1.0))[1] == window
    assert rec.tracker.snapshot()[-1] == window[0] and rec.tracker.num_announced == 3
    index = PrefixIndex()
    index.apply("r0", rec.events)
    assert index.match(ids("ns", tokens), ["r0"]) == {"r0": 3} and index.stored_blocks("r0") == 3
    rec.tree.flush()
    assert rec.events[-1] == BlockRemoved(tuple(ids("ns", tokens)))
    assert not rec.tracker.snapshot()[1:]


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


def test_a_snapshot_lists_the_announced_blocks_in_chained_runs():
    rec = Recorder(num_blocks=8)
    rec.cache("ns", list(range(12)))                     # 3 blocks
    rec.cache("ns", list(range(8)) + [70, 71, 72, 73])   # shares 2, adds 1
    rec.cache("other", list(range(8)))
    long, branch = ids("ns", list(range(12))), ids("ns", list(range(8)) + [70, 71, 72, 73])
    assert rec.tracker.snapshot() == [
        AllBlocksCleared(),
        BlockStored(tuple(long), None, tuple(range(12)), B),
        BlockStored((branch[2],), branch[1], (70, 71, 72, 73), B),
        BlockStored(tuple(ids("other", list(range(8)))), None, tuple(range(8)), B)]
    rec.tree.flush()
    assert rec.tracker.snapshot() == [AllBlocksCleared()]


# -- the stream over real ZMQ sockets (loopback): sequence numbers, replay, snapshot --------

class DroppingSocket:
    """The publisher's PUB socket, losing the batches numbered in ``drop`` (as a full send
    queue or a reconnect would); the publisher still counts them as sent."""

    def __init__(self, socket, drop: set[int]):
        self.socket, self.drop = socket, drop

    def send_multipart(self, frames):
        if int.from_bytes(frames[1], "big") not in self.drop:
            self.socket.send_multipart(frames)

    def close(self, linger=None):
        self.socket.close(linger=linger)


class Replica:
    """A tree whose events go out through a real KVEventPublisher with a replay socket."""

    def __init__(self, endpoint: str = "tcp://127.0.0.1:*",
                 replay: str | None = "tcp://127.0.0.1:*", replay_batches: int = 64):
        from radixgate.kv.events.publisher import KVEventPublisher
        self.pub = KVEventPublisher(endpoint, SEED, B, topic="r0", replay_endpoint=replay,
                                    replay_batches=replay_batches)
        self.pool = BlockPool(32, B)
        self.tree = RadixTree(self.pool, on_event=self.pub.put)
        wait_until(lambda: self.pub.published_batches >= 1)     # its AllBlocksCleared

    def lose(self, *sequences: int) -> None:
        self.pub._socket = DroppingSocket(self.pub._socket, set(sequences))

    def cache(self, tokens: list[int]) -> None:
        """Caches ``tokens`` in ``ns`` and waits until its batch is published."""
        sent = self.pub.published_batches
        Recorder.cache(self, "ns", tokens)
        wait_until(lambda: self.pub.published_batches > sent)

    def flush(self) -> None:
        sent = self.pub.published_batches
        self.tree.flush()
        wait_until(lambda: self.pub.published_batches > sent)

    def close(self) -> None:
        self.pub.close()


def wait_until(condition, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def follow():
    """``follow(replica, **subscriber options)``: an index fed by a KVEventSubscriber that
    follows ``replica`` (its live and replay endpoints)."""
    from radixgate.cluster.prefix_index import PrefixIndex
    from radixgate.cluster.subscriber import KVEventSubscriber
    started = []

    def make(replica: Replica, **options):
        sub = KVEventSubscriber(PrefixIndex(), threading.Lock(), **options)
        started.append(sub)
        sub.follow("r0", replica.pub.bound_endpoint, replica.pub.bound_replay_endpoint)
        return sub

    yield make
    for sub in started:
        sub.close()


def indexed(sub, tokens: list[int]) -> int:
    """Leading blocks of ``tokens`` the subscriber's index has on r0."""
    with sub.lock:
        return sub.index.match(ids("ns", tokens), ["r0"])["r0"]


A, C, D = list(range(12)), list(range(40, 52)), list(range(80, 92))      # 3 blocks each


def test_events_published_before_the_router_subscribed_are_indexed(follow):
    replica = Replica()
    replica.cache(A)
    sub = follow(replica, check_s=60.0)
    assert wait_until(lambda: indexed(sub, A) == 3), indexed(sub, A)
    replica.close()


def test_a_gap_in_the_sequence_is_filled_by_a_replay(follow):
    replica = Replica()
    sub = follow(replica, check_s=60.0)
    assert wait_until(lambda: sub.last_applied("r0") == 0)
    time.sleep(0.3)                                  # the SUB has joined
    replica.lose(1)
    replica.cache(A)                                 # batch 1: lost on the way
    replica.cache(C)                                 # batch 2: the gap shows
    assert wait_until(lambda: indexed(sub, A) == 3 and indexed(sub, C) == 3)
    assert sub.last_applied("r0") == 2 and sub.resyncs >= 2
    replica.close()


def test_a_lost_last_batch_is_found_while_the_replica_is_idle(follow):
    replica = Replica()
    sub = follow(replica, check_s=0.2)
    assert wait_until(lambda: sub.last_applied("r0") == 0)
    replica.lose(1)
    replica.cache(A)                                 # lost, and nothing follows it
    assert wait_until(lambda: indexed(sub, A) == 3)
    replica.close()


def test_blocks_removed_during_a_gap_older_than_the_replay_buffer_leave_the_index(follow):
    replica = Replica(replay_batches=1)
    sub = follow(replica, check_s=60.0)
    replica.cache(A)
    assert wait_until(lambda: indexed(sub, A) == 3)
    time.sleep(0.3)
    replica.lose(2, 3)
    replica.flush()                                  # batch 2: A removed, lost
    replica.cache(C)                                 # batch 3: lost
    replica.cache(D)                                 # batch 4: the only one kept for replay
    assert wait_until(lambda: indexed(sub, D) == 3 and indexed(sub, A) == 0)
    assert indexed(sub, C) == 3 and sub.index.stored_blocks("r0") == 6
    replica.close()


def test_a_restarted_publisher_is_resynced_and_its_earlier_blocks_leave_the_index(follow):
    from benchmarks.launch import free_ports
    live, replayed = free_ports(2)
    endpoints = dict(endpoint=f"tcp://127.0.0.1:{live}", replay=f"tcp://127.0.0.1:{replayed}")
    first = Replica(**endpoints)
    sub = follow(first, check_s=60.0)                # found by the stream, not the idle check
    first.cache(A)
    first.cache(C)
    assert wait_until(lambda: indexed(sub, A) == 3 and indexed(sub, C) == 3)
    first.close()
    second = rebind(endpoints)                       # its AllBlocksCleared goes before the
    time.sleep(0.5)                                  # SUB reconnects: lost
    second.cache(D)
    assert wait_until(lambda: indexed(sub, D) == 3 and indexed(sub, A) == 0)
    assert indexed(sub, C) == 0 and sub.index.stored_blocks("r0") == 3
    second.close()


def rebind(endpoints: dict) -> Replica:
    """A new publisher on the same ports (ZMQ frees a closed socket's port a moment later)."""
    import zmq
    deadline = time.monotonic() + 10
    while True:
        try:
            return Replica(**endpoints)
        except zmq.ZMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_the_replay_socket_answers_like_vllms(follow):
    """A REQ-style client: ``[start]`` in, ``[seq, payload]`` per batch and ``[-1, b""]``."""
    import zmq
    replica = Replica()
    replica.cache(A)
    replica.cache(C)
    client = zmq.Context.instance().socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(replica.pub.bound_replay_endpoint)
    client.send_multipart((b"", (1).to_bytes(8, "big")))
    answer = []
    while client.poll(5000):
        _, seq, payload = client.recv_multipart()
        answer.append((int.from_bytes(seq, "big", signed=True), payload))
        if not payload:
            break
    client.close()
    replica.close()
    assert [seq for seq, _ in answer] == [1, 2, -1]
    assert decode_batch(answer[0][1])[1][0].block_hashes == tuple(ids("ns", A))
