"""``radixgate serve --kv-events-endpoint``: a single server publishes its cache's KV events
(vLLM's format) to a real ZMQ SUB socket over loopback, addressed by the chained hashes of
the prompt's full blocks in the tenant's namespace; ``[server] kv_events_replay_endpoint``
answers a late subscriber with what it missed."""
from __future__ import annotations

import time

import pytest
import zmq

from benchmarks.launch import free_ports
from radixgate.cluster.prefix_index import PrefixIndex
from radixgate.gateway.auth import namespace_for
from radixgate.kv.events.blocks import hash_seed, prompt_block_ids
from radixgate.kv.events.wire import BlockRemoved, BlockStored, decode_batch
from tests.support.server import ADMIN_KEY, ServerProcess, ServerSpec
from tests.test_cluster_ray import call, complete

PORTS: dict[str, int] = {}                     # the running server's endpoints
PROMPT = list(range(2000, 2000 + 70))          # 4 full blocks of 16 and a partial one


@pytest.fixture(scope="module")
def server():
    """Its ports are picked as it starts (picked at collection, another test's server
    took one of them minutes later), all three together: the HTTP port picked after the
    event ports were released was once one of them, and /health met a ZMQ socket."""
    PORTS["live"], PORTS["replay"], http = free_ports(3)
    spec = ServerSpec(tenants=("acme",),
                      extra_args=("--kv-events-endpoint", f"tcp://127.0.0.1:{PORTS['live']}"),
                      server_settings=(("kv_events_replay_endpoint",
                                        f'"tcp://127.0.0.1:{PORTS["replay"]}"'),))
    srv = ServerProcess(spec, port=http).start()
    yield srv
    srv.stop()


@pytest.fixture
def subscriber(server):
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(f"tcp://127.0.0.1:{PORTS['live']}")
    time.sleep(0.5)                              # a SUB joins a few ms after connect
    yield socket
    socket.close(linger=0)


def receive(socket, until, timeout_s: float = 20.0) -> list:
    """Events until ``until(events)`` holds (or the timeout)."""
    events: list = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not until(events):
        if socket.poll(200):
            topic, sequence, payload = socket.recv_multipart()
            assert len(sequence) == 8
            events.extend(decode_batch(payload)[1])
    return events


def hashes(events, kind) -> set[int]:
    return {h for e in events if isinstance(e, kind) for h in e.block_hashes}


def test_a_prompt_s_full_blocks_are_published_by_content_and_removed_on_flush(server, subscriber):
    status, stats = call(server, "/v1/cache/stats", ADMIN_KEY)
    seed = hash_seed("tiny-random-llama", stats["kv_dtype"], 16)
    expected = set(prompt_block_ids(seed, namespace_for("acme"), PROMPT, 16))
    assert len(expected) == 4
    complete(server, "acme", PROMPT)
    events = receive(subscriber, lambda ev: expected <= hashes(ev, BlockStored))
    assert expected <= hashes(events, BlockStored)
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert all(e.block_size == 16 and len(e.token_ids) == 16 * len(e.block_hashes)
               for e in stored)
    first = next(e for e in stored if e.parent_block_hash is None)
    assert list(first.token_ids) == PROMPT[:len(first.token_ids)]
    status, _ = call(server, "/v1/cache/flush", ADMIN_KEY, {})
    assert status == 200
    events = receive(subscriber, lambda ev: expected <= hashes(ev, BlockRemoved))
    assert expected <= hashes(events, BlockRemoved)


def test_a_late_subscriber_gets_what_it_missed_from_the_replay_endpoint(server):
    """Asked from batch 0, the replay brings every batch the server sent (or a snapshot):
    applied in order, they say which of the prompt's blocks are cached now."""
    status, stats = call(server, "/v1/cache/stats", ADMIN_KEY)
    seed = hash_seed("tiny-random-llama", stats["kv_dtype"], 16)
    prompt = list(range(5000, 5000 + 70))
    complete(server, "acme", prompt)
    ids = prompt_block_ids(seed, namespace_for("acme"), prompt, 16)
    index = PrefixIndex()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and index.match(ids, ["s"])["s"] < 4:
        index = PrefixIndex()
        for payload in replay(f"tcp://127.0.0.1:{PORTS['replay']}", start=0):
            index.apply("s", decode_batch(payload)[1])
    assert index.match(ids, ["s"]) == {"s": 4}


def replay(endpoint: str, start: int) -> list[bytes]:
    """The payloads a DEALER gets for ``[start]``, up to the end marker."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    socket.send_multipart((b"", start.to_bytes(8, "big")))
    payloads = []
    try:
        while socket.poll(10_000):
            _, _, payload = socket.recv_multipart()
            if not payload:
                return payloads
            payloads.append(payload)
        raise AssertionError(f"no end of replay from {endpoint}")
    finally:
        socket.close(linger=0)
