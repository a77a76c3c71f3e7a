"""Feeds a ``PrefixIndex`` from the replicas' KV-event streams (ZMQ SUB, one thread).

Each replica publishes on its own endpoint with its replica id as the topic; one SUB
socket connects to all of them, and the topic frame says whose event it is. Connecting and
disconnecting happen on the subscriber's thread (ZMQ sockets are not thread-safe): other
threads only queue the change. The index is shared with the router's thread under
``lock``.
"""
from __future__ import annotations

import logging
import queue
import threading

from .kv_decode import KVDecodeError, decode_batch
from .prefix_index import PrefixIndex

log = logging.getLogger(__name__)
POLL_MS = 100


class KVEventSubscriber:
    def __init__(self, index: PrefixIndex, lock: threading.Lock):
        import zmq
        self.index = index
        self.lock = lock
        self.received_batches = 0
        self._zmq = zmq
        self._changes: queue.SimpleQueue = queue.SimpleQueue()
        self._endpoints: dict[str, str] = {}      # replica -> endpoint (subscriber thread)
        self._wanted: dict[str, str] = {}         # what callers asked for (their threads)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="radixgate-kv-subscriber",
                                        daemon=True)
        self._thread.start()

    def follow(self, replica: str, endpoint: str) -> None:
        """Subscribe to ``replica``'s events at ``endpoint`` (idempotent)."""
        if self._wanted.get(replica) != endpoint:
            self._wanted[replica] = endpoint
            self._changes.put((replica, endpoint))

    def forget(self, replica: str) -> None:
        """Stop listening to ``replica`` and drop its index entries."""
        if self._wanted.pop(replica, None) is not None:
            self._changes.put((replica, None))
        with self.lock:
            self.index.drop_replica(replica)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)

    def _run(self) -> None:
        zmq = self._zmq
        socket = zmq.Context.instance().socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            while not self._stop.is_set():
                self._apply_changes(socket)
                if socket.poll(POLL_MS):
                    self._receive(socket.recv_multipart())
        finally:
            socket.close(linger=0)

    def _apply_changes(self, socket) -> None:
        while True:
            try:
                replica, endpoint = self._changes.get_nowait()
            except queue.Empty:
                return
            old = self._endpoints.pop(replica, None)
            if old is not None and old not in self._endpoints.values():
                socket.disconnect(old)
            if endpoint is not None:
                socket.connect(endpoint)
                self._endpoints[replica] = endpoint

    def _receive(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            return
        replica = frames[0].decode(errors="replace")
        if replica not in self._endpoints:
            return                       # a replica we no longer follow
        try:
            _, events, _ = decode_batch(frames[2])
        except KVDecodeError:
            log.warning("undecodable KV event batch from %s", replica)
            return
        with self.lock:
            self.index.apply(replica, events)
        self.received_batches += 1
