"""KV events on the wire: vLLM's ``KVEventBatch`` in msgpack, published over ZMQ PUB.

Wire format (vLLM's ``vllm/distributed/kv_events.py`` structs, ``array_like`` and tagged,
which external routers such as llm-d and Dynamo decode), one ZMQ multipart message per
batch: ``[topic, sequence number (8 bytes, big-endian), payload]`` with payload::

    [ts: float, [event, ...], data_parallel_rank: int | None]
    event: ["BlockStored", block_hashes: [int], parent_block_hash: int | None,
            token_ids: [int], block_size: int, lora_id: None, medium: str, lora_name: None]
         | ["BlockRemoved", block_hashes: [int], medium: str]
         | ["AllBlocksCleared"]

Block hashes are signed 64-bit ints, radixgate's own chained content addresses
(``radix_cache/block_hash.py``: seeded by the model and KV layout, chained from the
namespace's root), so they identify a block across radixgate engines but are not vLLM's
hash values. Events carry every tenant's token ids: the publisher binds to loopback unless
told otherwise (``check_endpoint``).
"""
from __future__ import annotations

import ipaddress
import logging
import queue
import threading
import time
from itertools import count
from urllib.parse import urlsplit

import msgpack

from radixgate.radix_cache.events import CacheEvent
from radixgate.radix_cache.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,
                                             BlockTracker, KVEvent)

log = logging.getLogger(__name__)
MAX_EVENTS_PER_BATCH = 512
DEFAULT_MEDIUM = "GPU"      # vLLM's name for the engine's own KV pool (whatever the device)


class EndpointError(ValueError):
    pass


def check_endpoint(endpoint: str, allow_remote: bool = False) -> str:
    """``tcp://HOST:PORT`` (PORT ``*``: any free one; or ``ipc://``/``inproc://``) to bind; HOST must be a loopback
    address unless ``allow_remote`` (the events carry every tenant's token ids)."""
    parts = urlsplit(endpoint)
    if parts.scheme in ("ipc", "inproc"):
        return endpoint
    host, _, port = parts.netloc.rpartition(":")
    host = host.strip("[]")
    if parts.scheme != "tcp" or not host or not (port == "*" or port.isdigit()):
        raise EndpointError(f"KV events endpoint must look like tcp://127.0.0.1:5557 "
                            f"(port * picks a free one), got {endpoint!r}")
    if not allow_remote and not _is_loopback(host):
        raise EndpointError(f"KV events endpoint {endpoint!r} is not a loopback address: "
                            "the events carry every tenant's token ids (pass "
                            "--kv-events-allow-remote to bind it anyway)")
    return endpoint


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def encode_event(event: KVEvent, medium: str = DEFAULT_MEDIUM) -> list:
    if isinstance(event, BlockStored):
        return ["BlockStored", list(event.block_hashes), event.parent_block_hash,
                list(event.token_ids), event.block_size, None, medium, None]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", list(event.block_hashes), medium]
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {event!r}")


def encode_batch(events: list[KVEvent], ts: float, rank: int | None = None,
                 medium: str = DEFAULT_MEDIUM) -> bytes:
    """One ``KVEventBatch`` as msgpack bytes."""
    return msgpack.packb([ts, [encode_event(e, medium) for e in events], rank],
                         use_bin_type=True)


def hash_seed(model_name: str, kv_dtype: str, block_size: int) -> str:
    """What every block hash of an engine is seeded with: engines that share it compute the
    same K/V for the same tokens (same model, KV dtype and block layout)."""
    return f"{model_name}|{kv_dtype}|{block_size}"


class KVEventPublisher:
    """Publishes the tree's events from a thread of its own.

    ``put`` (the tree's ``on_event`` sink, engine thread) only queues the ``CacheEvent``;
    the publisher thread converts events in order (``BlockTracker``: hashing happens off
    the engine thread), batches what has queued up and sends each batch. The first batch
    is ``AllBlocksCleared``: a subscriber drops what it knew of an engine that restarted.
    ``listeners`` get every batch's events too (in-process consumers, tests).
    """

    def __init__(self, endpoint: str, seed: str, block_size: int, *, topic: str = "",
                 rank: int | None = None, allow_remote: bool = False):
        import zmq
        self.endpoint = check_endpoint(endpoint, allow_remote)
        self.tracker = BlockTracker(seed, block_size)
        self.rank = rank
        self.published_batches = 0
        self._topic = topic.encode()
        self._sequence = count()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 100_000)
        self._socket.bind(self.endpoint)
        self.bound_endpoint = self._socket.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._thread = threading.Thread(target=self._run, name="radixgate-kv-events",
                                        daemon=True)
        self._queue.put(None)            # start with AllBlocksCleared
        self._thread.start()

    def put(self, event: CacheEvent) -> None:
        self._queue.put(event)

    def announce_cleared(self) -> None:
        self._queue.put(None)

    def close(self, timeout_s: float = 2.0) -> None:
        """Sends what is queued, then stops the thread and closes the socket."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        self._socket.close(linger=0)

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < MAX_EVENTS_PER_BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = _STOP in items
            events = [e for e in (self._convert(i) for i in items if i is not _STOP) if e]
            if events:
                self._send(events)
            if stop:
                return

    def _convert(self, item: CacheEvent | None) -> KVEvent | None:
        try:
            return self.tracker.clear() if item is None else self.tracker.convert(item)
        except Exception:  # noqa: BLE001 - one bad event never stops the stream
            log.exception("KV event conversion failed")
            return None

    def _send(self, events: list[KVEvent]) -> None:
        payload = encode_batch(events, time.time(), self.rank)
        sequence = next(self._sequence).to_bytes(8, "big")
        try:
            self._socket.send_multipart((self._topic, sequence, payload))
            self.published_batches += 1
        except Exception:  # noqa: BLE001 - a send error drops the batch, never the thread
            log.exception("KV event publish failed")


_STOP = object()
