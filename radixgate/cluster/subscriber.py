"""Feeds a ``PrefixIndex`` from the replicas' KV-event streams (ZMQ, one thread).

Each replica publishes on its own endpoint with its replica id as the topic; one SUB
socket connects to all of them, and the topic frame says whose event it is. Connecting and
disconnecting happen on the subscriber's thread (ZMQ sockets are not thread-safe): other
threads only queue the change. The index is shared with the router's thread under
``lock``.

Batches are numbered (``radixgate/kv/events/publisher.py``). Per replica, the subscriber keeps the
number of the last batch it applied and resyncs the replica through its replay endpoint
(a DEALER socket to the publisher's ROUTER) when the stream cannot be trusted:

- at subscribe time: what a PUB sent before the SUB joined is lost (ZMQ's slow joiner);
- on a gap: a batch was dropped (a full send queue, a reconnect);
- when the numbers go back (the publisher restarted): a resync from 0, whose answer
  starts with ``AllBlocksCleared``, so the blocks of the earlier run leave the index;
- after ``check_s`` without a batch: a lost last batch shows no gap until the next one.

The answer is the batches since the last one applied, or a snapshot of what the replica
caches now (then the index entries of blocks it no longer holds are gone). Live batches
that arrive meanwhile wait and are applied after it, those it covered skipped. A batch
numbered at or below the last one applied is a restart only when it is newer (its ``ts``)
than that one: else it is a live copy of a batch the replay brought first. A replica
without a replay endpoint gets its batches applied as they come; gaps are only counted.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from radixgate.kv.events.wire import KVDecodeError, decode_batch
from .prefix_index import PrefixIndex

log = logging.getLogger(__name__)
POLL_MS = 100
CHECK_S = 2.0                 # an idle replica is asked for what it sent since, this often
REPLAY_TIMEOUT_S = 5.0        # an unanswered replay request is asked again, on a new socket
MAX_WAITING_BATCHES = 100_000  # live batches held during a replay (beyond: a gap, resynced)


@dataclass
class _Feed:
    """One followed replica, on the subscriber's thread."""

    endpoint: str
    replay_endpoint: str | None
    dealer: object = None
    last: int | None = None               # number of the last batch applied
    last_ts: float = float("-inf")        # its publish time
    asked_at: float | None = None         # a replay request is in flight since then
    asked_from: int = 0
    idle_since: float = field(default_factory=time.monotonic)
    waiting: deque = field(default_factory=lambda: deque(maxlen=MAX_WAITING_BATCHES))


class KVEventSubscriber:
    def __init__(self, index: PrefixIndex, lock: threading.Lock, *, check_s: float = CHECK_S,
                 replay_timeout_s: float = REPLAY_TIMEOUT_S):
        import zmq
        self.index = index
        self.lock = lock
        self.check_s = check_s
        self.replay_timeout_s = replay_timeout_s
        self.received_batches = 0     # applied, live or replayed
        self.resyncs = 0              # replays asked for at subscribe, on a gap or a restart
        self.gaps = 0                 # gaps seen on streams without a replay endpoint
        self._zmq = zmq
        self._changes: queue.SimpleQueue = queue.SimpleQueue()
        self._feeds: dict[str, _Feed] = {}                        # subscriber thread
        self._wanted: dict[str, tuple[str, str | None]] = {}      # callers' threads
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="radixgate-kv-subscriber",
                                        daemon=True)
        self._thread.start()

    def follow(self, replica: str, endpoint: str, replay_endpoint: str | None = None) -> None:
        """Subscribe to ``replica``'s events at ``endpoint`` (idempotent); with a
        ``replay_endpoint``, resynced at once and whenever its stream has a gap."""
        wanted = (endpoint, replay_endpoint)
        if self._wanted.get(replica) != wanted:
            self._wanted[replica] = wanted
            self._changes.put((replica, wanted))

    def forget(self, replica: str) -> None:
        """Stop listening to ``replica`` and drop its index entries."""
        if self._wanted.pop(replica, None) is not None:
            self._changes.put((replica, None))
        with self.lock:
            self.index.drop_replica(replica)

    def last_applied(self, replica: str) -> int | None:
        """The number of the last batch of ``replica`` in the index (None: none yet)."""
        feed = self._feeds.get(replica)
        return None if feed is None else feed.last

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)

    # -- the thread -------------------------------------------------------------------
    def _run(self) -> None:
        zmq = self._zmq
        self._context = zmq.Context.instance()
        self._sub = self._context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._poller = zmq.Poller()
        self._poller.register(self._sub, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                self._apply_changes()
                for socket, _ in self._poller.poll(POLL_MS):
                    self._receive(socket)
                self._check_feeds(time.monotonic())
        finally:
            for feed in self._feeds.values():
                self._close_dealer(feed)
            self._sub.close(linger=0)

    def _receive(self, socket) -> None:
        frames = socket.recv_multipart()
        if socket is self._sub:
            self._on_live(frames)
            return
        for replica, feed in self._feeds.items():
            if feed.dealer is socket:
                self._on_replay(replica, feed, frames)
                return

    def _apply_changes(self) -> None:
        while True:
            try:
                replica, wanted = self._changes.get_nowait()
            except queue.Empty:
                return
            old = self._feeds.pop(replica, None)
            if old is not None:
                self._close_dealer(old)
                if old.endpoint not in {f.endpoint for f in self._feeds.values()}:
                    self._sub.disconnect(old.endpoint)
            if wanted is None:
                with self.lock:                  # batches applied since forget() was called
                    self.index.drop_replica(replica)
                continue
            feed = _Feed(*wanted)
            self._sub.connect(feed.endpoint)
            self._feeds[replica] = feed
            if feed.replay_endpoint is not None:
                self._open_dealer(feed)
                self._ask(feed, 0, resync=True)

    # -- live batches -----------------------------------------------------------------
    def _on_live(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            return
        replica = frames[0].decode(errors="replace")
        feed = self._feeds.get(replica)
        if feed is None:
            return                       # a replica we no longer follow
        feed.idle_since = time.monotonic()
        self._take(replica, feed, int.from_bytes(frames[1], "big"), frames[2])

    def _take(self, replica: str, feed: _Feed, seq: int, payload: bytes) -> None:
        """A live batch: applied when it is the next one, else held for a resync."""
        if feed.asked_at is not None:
            feed.waiting.append((seq, payload))
            return
        decoded = _decode(replica, payload)
        if feed.last is not None and seq <= feed.last and decoded[0] <= feed.last_ts:
            return                       # a copy of a batch a replay brought first
        if feed.last is not None and seq == feed.last + 1 or feed.replay_endpoint is None:
            if feed.last is not None and seq != feed.last + 1:
                self.gaps += 1
                log.warning("KV events of %s: batch %d after %d, no replay endpoint to "
                            "resync from", replica, seq, feed.last)
            self._apply(replica, feed, seq, decoded)
            return
        restarted = feed.last is None or seq <= feed.last
        log.info("KV events of %s: batch %d after %s: resyncing", replica, seq, feed.last)
        self._ask(feed, 0 if restarted else feed.last + 1, resync=True)
        feed.waiting.append((seq, payload))

    def _apply(self, replica: str, feed: _Feed, seq: int, decoded) -> None:
        ts, events = decoded
        with self.lock:
            self.index.apply(replica, events)
        feed.last, feed.last_ts = seq, ts
        self.received_batches += 1

    # -- replays ----------------------------------------------------------------------
    def _ask(self, feed: _Feed, start: int, resync: bool = False) -> None:
        """Asks for the batches from ``start`` on (unanswered: asked again after
        ``replay_timeout_s``)."""
        try:
            feed.dealer.send_multipart((b"", start.to_bytes(8, "big")), self._zmq.NOBLOCK)
        except self._zmq.Again:
            pass
        feed.asked_at, feed.asked_from = time.monotonic(), start
        self.resyncs += resync

    def _on_replay(self, replica: str, feed: _Feed, frames: list[bytes]) -> None:
        if len(frames) != 3 or feed.asked_at is None:
            return
        if frames[2]:
            self._apply(replica, feed, int.from_bytes(frames[1], "big"),
                        _decode(replica, frames[2]))
            return
        feed.asked_at = None                # the end marker
        if feed.last is None:
            feed.last = feed.asked_from - 1  # nothing had been published yet
        feed.idle_since = time.monotonic()
        waiting = list(feed.waiting)
        feed.waiting.clear()
        for seq, payload in waiting:
            self._take(replica, feed, seq, payload)

    def _check_feeds(self, now: float) -> None:
        for feed in self._feeds.values():
            if feed.replay_endpoint is None:
                continue
            if feed.asked_at is not None:
                if now - feed.asked_at > self.replay_timeout_s:
                    log.warning("KV events replay from %s unanswered: asking again",
                                feed.replay_endpoint)
                    self._close_dealer(feed)
                    self._open_dealer(feed)
                    self._ask(feed, feed.asked_from)
            elif now - feed.idle_since > self.check_s:
                feed.idle_since = now
                self._ask(feed, 0 if feed.last is None else feed.last + 1)

    def _open_dealer(self, feed: _Feed) -> None:
        zmq = self._zmq
        feed.dealer = self._context.socket(zmq.DEALER)
        feed.dealer.setsockopt(zmq.LINGER, 0)
        feed.dealer.connect(feed.replay_endpoint)
        self._poller.register(feed.dealer, zmq.POLLIN)

    def _close_dealer(self, feed: _Feed) -> None:
        if feed.dealer is not None:
            self._poller.unregister(feed.dealer)
            feed.dealer.close(linger=0)
            feed.dealer = None


def _decode(replica: str, payload: bytes) -> tuple[float, list]:
    """``(ts, events)`` of a batch; an undecodable one counts as empty (its number still
    moves the stream on)."""
    try:
        ts, events, _ = decode_batch(payload)
        return ts, events
    except KVDecodeError:
        log.warning("undecodable KV event batch from %s", replica)
        return float("-inf"), []
