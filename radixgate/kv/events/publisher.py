"""KV events over ZMQ: the tree's events, converted (``blocks.py``) and encoded
(``wire.py``: vLLM's ``KVEventBatch``), published on a ZMQ PUB socket.

One ZMQ multipart message per batch: ``[topic, sequence number (8 bytes, big-endian),
payload]``. Events carry every tenant's token ids: the publisher binds to loopback unless
told otherwise (``check_endpoint``).

Replay (vLLM's replay socket, with a snapshot added): with a ``replay_endpoint`` the
publisher also binds a ZMQ ROUTER socket. A request ``[start sequence (8 bytes)]`` (from a
DEALER or REQ: ``[identity, b"", start]`` on the ROUTER) is answered with the batches
``[sequence, payload]`` numbered ``start`` and after, then the end marker ``[-1 (8 bytes,
signed), b""]``. When ``start`` is older than the last ``replay_batches`` batches kept, or
ahead of what this publisher sent (the subscriber knew an earlier run of it), the answer is
one snapshot batch instead, numbered as the last batch sent: ``AllBlocksCleared`` followed
by ``BlockStored`` for every block cached now (``BlockTracker.snapshot``). A subscriber that
applies the answer in order is then exactly where the live stream continues.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from urllib.parse import urlsplit

from radixgate.kv.core.events import CacheEvent
from radixgate.kv.events.blocks import BlockTracker
from radixgate.kv.events.wire import KVEvent, encode_batch
from radixgate.loopback import is_loopback

log = logging.getLogger(__name__)
MAX_EVENTS_PER_BATCH = 512
REPLAY_BATCHES = 1024       # recent batches kept for replay (an older start gets a snapshot)
REPLAY_POLL_S = 0.05        # how often an idle publisher looks for replay requests
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


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
    if not allow_remote and not is_loopback(host):
        raise EndpointError(f"KV events endpoint {endpoint!r} is not a loopback address: "
                            "the events carry every tenant's token ids (pass "
                            "--kv-events-allow-remote to bind it anyway)")
    return endpoint


class KVEventPublisher:
    """Publishes the tree's events from a thread of its own.

    ``put`` (the tree's ``on_event`` sink, engine thread) only queues the ``CacheEvent``;
    the publisher thread converts events in order (``BlockTracker``: hashing happens off
    the engine thread), batches what has queued up and sends each batch, numbered from 0.
    The first batch is ``AllBlocksCleared``: a subscriber drops what it knew of an engine
    that restarted. Replay requests (``replay_endpoint``) are answered on the same thread,
    between batches, so a snapshot is exactly the state after the last batch sent.
    """

    def __init__(self, endpoint: str, seed: str, block_size: int, *, topic: str = "",
                 rank: int | None = None, allow_remote: bool = False,
                 replay_endpoint: str | None = None, replay_batches: int = REPLAY_BATCHES):
        import zmq
        self.endpoint = check_endpoint(endpoint, allow_remote)
        self.tracker = BlockTracker(seed, block_size)
        self.rank = rank
        self.published_batches = 0
        self.replays_answered = 0
        self._topic = topic.encode()
        self._last_sequence = -1
        self._recent: deque[tuple[int, bytes]] = deque(maxlen=max(1, replay_batches))
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._context = zmq.Context.instance()
        self._socket = self._bind(zmq.PUB, self.endpoint, send_limit=100_000)
        self.bound_endpoint = self._socket.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._replay = None
        self.bound_replay_endpoint: str | None = None
        if replay_endpoint is not None:
            # a whole answer is queued at once (a ROUTER drops what is beyond its limit)
            try:
                self._replay = self._bind(zmq.ROUTER,
                                          check_endpoint(replay_endpoint, allow_remote),
                                          send_limit=4 * (self._recent.maxlen + 2))
            except Exception:
                self._socket.close(linger=0)
                raise
            self.bound_replay_endpoint = self._replay.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._thread = threading.Thread(target=self._run, name="radixgate-kv-events",
                                        daemon=True)
        self._queue.put(None)            # start with AllBlocksCleared
        self._thread.start()

    def _bind(self, kind: int, endpoint: str, send_limit: int):
        import zmq
        socket = self._context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, send_limit)
        try:
            socket.bind(endpoint)
        except zmq.ZMQError:
            socket.close(linger=0)
            raise
        return socket

    def put(self, event: CacheEvent) -> None:
        self._queue.put(event)

    def announce_cleared(self) -> None:
        self._queue.put(None)

    def close(self, timeout_s: float = 2.0) -> None:
        """Sends what is queued, then stops the thread and closes the sockets."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        self._socket.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _run(self) -> None:
        while True:
            self._answer_replays()
            items = self._next_items()
            stop = _STOP in items
            events = [e for e in (self._convert(i) for i in items if i is not _STOP) if e]
            if events:
                self._send(events)
            if stop:
                return

    def _next_items(self) -> list:
        """What has queued up, up to a batch; [] after ``REPLAY_POLL_S`` without any when
        replay requests are to be watched."""
        wait = REPLAY_POLL_S if self._replay is not None else None
        try:
            items = [self._queue.get(timeout=wait)]
        except queue.Empty:
            return []
        while len(items) < MAX_EVENTS_PER_BATCH:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _convert(self, item: CacheEvent | None) -> KVEvent | None:
        try:
            return self.tracker.clear() if item is None else self.tracker.convert(item)
        except Exception:  # noqa: BLE001 - one bad event never stops the stream
            log.exception("KV event conversion failed")
            return None

    def _send(self, events: list[KVEvent]) -> None:
        payload = encode_batch(events, time.time(), self.rank)
        self._last_sequence += 1
        self._recent.append((self._last_sequence, payload))
        try:
            self._socket.send_multipart((self._topic, self._last_sequence.to_bytes(8, "big"),
                                         payload))
            self.published_batches += 1
        except Exception:  # noqa: BLE001 - a send error drops the batch, never the thread
            log.exception("KV event publish failed")

    # -- replay -----------------------------------------------------------------------
    def _answer_replays(self) -> None:
        while self._replay is not None and self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("malformed KV event replay request (%d frames)", len(frames))
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big")
            try:
                for sequence, payload in self.replay_from(start):
                    self._replay.send_multipart((identity, b"", sequence.to_bytes(8, "big"),
                                                 payload))
                self._replay.send_multipart((identity, b"", END_OF_REPLAY, b""))
                self.replays_answered += 1
            except Exception:  # noqa: BLE001 - a failed answer never stops the stream
                log.exception("KV event replay failed")

    def replay_from(self, start: int) -> list[tuple[int, bytes]]:
        """``(sequence, payload)`` for a subscriber holding every batch before ``start``:
        the kept batches from ``start`` on; a snapshot when they no longer reach back to
        ``start``, or when ``start`` is beyond the next batch (an earlier run's numbers).
        Publisher thread only."""
        last = self._last_sequence
        if last < 0 or start == last + 1:
            return []
        oldest = self._recent[0][0]
        if oldest <= start <= last:
            return [(seq, payload) for seq, payload in self._recent if seq >= start]
        return [(last, encode_batch(self.tracker.snapshot(), time.time(), self.rank))]


_STOP = object()
