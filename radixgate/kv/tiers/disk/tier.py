"""KVTier: a KV tier below memory (disk or host RAM) that keeps evicted blocks and loads
them back into memory blocks on a later hit.

Engine thread (between or inside steps, never blocking on I/O):

- ``spill(namespace, tokens, start, end, blocks)``: the tree is evicting ``blocks``
  (``RadixTree.spill``); the ones the tier lacks are copied at once into a staging buffer
  (the pool hands the blocks out again right after) and queued for the writer thread.
  Within ``staging_bytes`` of queued copies; beyond, or while the folder is full, the blocks
  are dropped (counted), never waited for. Staged blocks are found and served from their
  copies until the writer has stored them (a hit right after an eviction does not depend
  on how fast the disk is).
- ``chain`` / ``find``: the stored run extending a memory match (``TierIndex.longest_run``).
- ``load(run, blocks)``: the reader thread reads, checks (records.py) and writes the run's
  records into ``blocks`` (the admitted request's own, which nothing else reads or writes
  meanwhile) and calls ``wake`` when done; the request waits, the engine steps on.
- ``purge(namespace)`` (a flush), ``retain(namespace, tokens, ttl_s)`` (a pin), ``stats()``.

Addresses are ``kv.core.block_hash`` chains seeded with the model fingerprint
(fingerprint.py): another model, dtype, layout or block size, and another namespace, finds
nothing. A purge bumps its namespace's epoch, so a write staged before it never lands.
"""
from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

from radixgate.plural import plural
from radixgate.kv.core.block_hash import block_hashes, root_hash
from radixgate.kv.tiers.index import TierIndex, TierRecord, TierRun, block_addresses

from .backends import TierBackend
from .reader import LoadTicket, run_reader
from .records import PREFIX_BYTES
from .writer import Purge, StagedWrite, run_writer, save_retention

log = logging.getLogger(__name__)

DROP_REASONS = ("backlog", "disk_full", "too_large", "error", "corrupt", "missing")
DEFAULT_STAGING_BYTES = 256 << 20


@dataclass(frozen=True, slots=True)
class TierStats:
    """The tier at a moment (counters since start)."""

    kind: str                     # "disk" or "memory"
    folder: str
    budget_bytes: int
    blocks: int                   # records held (full blocks and tails)
    bytes: int
    retained_blocks: int          # held for an unexpired pin's retention
    hit_tokens: int               # prompt tokens requests got from this tier
    loads: int                    # load jobs (one per admitted request)
    loaded_blocks: int
    load_bytes: int
    load_s: float                 # loader time (load_bytes / load_s: the read speed)
    writes: int                   # records written
    write_bytes: int
    evicted: int                  # records removed for the budget
    drops: Mapping[str, int]      # blocks not written / not served, by reason
    full: bool                    # writes stopped: the folder's disk is full
    staged_bytes: int             # copies waiting for the writer


def space_key(namespace: str) -> str:
    """A namespace's folder name: a hash (namespace strings are never stored in clear)."""
    return hashlib.blake2b(namespace.encode(), digest_size=8).hexdigest()


class KVTier:
    def __init__(self, backend: TierBackend, kv, fingerprint: bytes, budget_bytes: int, *,
                 kind: str = "disk", folder: str = "",
                 staging_bytes: int = DEFAULT_STAGING_BYTES,
                 clock: Callable[[], float] = time.time,
                 wake: Callable[[], None] | None = None):
        """``wake``: called on the reader thread after each load (``load``) finished, so
        the engine thread looks again; it must not block."""
        self.backend, self.kv, self.fingerprint = backend, kv, fingerprint
        self.kind, self.folder, self.clock = kind, folder, clock
        self.block_size = kv.block_size
        self.staging_limit = max(1, min(staging_bytes, budget_bytes))
        self.index = TierIndex(budget_bytes, self.block_size)
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)
        self.pending: set[bytes] = set()
        self.staged = TierIndex(1 << 62, self.block_size)   # staged, not yet written
        self.staged_parts: dict[bytes, tuple[list, int, bool]] = {}
        self.staged_bytes = 0
        self.epoch, self.epochs = 0, {}
        self.full_until = 0.0
        self.wake = wake
        self.counts = dict.fromkeys(("hit_tokens", "loads", "loaded_blocks", "load_bytes",
                                     "writes", "write_bytes", "evicted"), 0)
        self.load_s = 0.0
        self.drops = dict.fromkeys(DROP_REASONS, 0)
        self.part_layers = kv.part_layers()
        self.slot_bytes = kv.slot_bytes()
        self._roots: dict[str, bytes] = {}
        self.retention_dirty = False
        self.retention_saved = 0.0
        self.closed = False                 # after close(): spill stages nothing
        self._learn_held()
        self.write_queue: queue.SimpleQueue = queue.SimpleQueue()
        self.load_queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=run_writer, args=(self,),
                                          name="radixgate-tier-writer", daemon=True),
                         threading.Thread(target=run_reader, args=(self,),
                                          name="radixgate-tier-reader", daemon=True)]
        for thread in self._threads:
            thread.start()

    def _learn_held(self) -> None:
        """The index of what the backend holds (warm restart; record files are read only
        when loaded), trimmed to the budget."""
        for record in self.backend.scan():
            if record.full:
                record.count = self.block_size
            self.index.add(record)
        self.index.retention = self.backend.load_retention()
        for record in self.index.victims(0, self.clock()):
            self.index.remove(record.digest)
            self.backend.delete(record)
        if len(self.index):
            log.info("KV %s tier %s: %s (%.1f MiB) from an earlier run", self.kind,
                     self.folder, plural(len(self.index), "block"), self.index.nbytes / 2**20)

    # ---- sizes and addresses ------------------------------------------------------------
    def payload_bytes(self, count: int) -> int:
        return count * sum(n * b for n, b in zip(self.part_layers, self.slot_bytes))

    def record_bytes(self, count: int) -> int:
        return PREFIX_BYTES + self.payload_bytes(count)

    def root(self, namespace: str) -> bytes:
        root = self._roots.get(namespace)
        if root is None:
            if len(self._roots) > 4096:
                self._roots.clear()
            root = self._roots[namespace] = root_hash(self.fingerprint, namespace)
        return root

    def chain(self, namespace: str, tokens: Sequence[int]) -> list[bytes]:
        """The full-block hashes of ``tokens`` in ``namespace``."""
        n = len(tokens) // self.block_size * self.block_size
        return block_hashes(self.root(namespace), tokens[:n], self.block_size)

    def holds_namespace(self, namespace: str) -> bool:
        with self.lock:
            space = space_key(namespace)
            return self.index.has_space(space) or self.staged.has_space(space)

    def find(self, namespace: str, tokens: Sequence[int], first_index: int,
             chain: Sequence[bytes]) -> TierRun | None:
        """The stored run from block ``first_index`` (``chain``: ``chain(namespace, tokens)``)."""
        with self.lock:
            return self.index.longest_run(chain, self.root(namespace), tokens, first_index,
                                          also=self.staged)

    # ---- engine thread: spill, load, purge, retain ----------------------------------------
    def spill(self, namespace: str, tokens: Sequence[int], start: int, end: int,
              blocks: Sequence[int], wait: bool = False) -> int:
        """Stage the blocks of ``[start, end)`` the tier lacks (``tokens``: the path from
        the namespace's root, at least ``end`` of them); returns how many were staged.
        ``wait``: block while the staging buffer is full (shutdown) instead of dropping.
        Never raises (a failure is logged and counted); nothing once closed."""
        if self.closed:
            return 0
        try:
            return self._spill(namespace, tokens, start, end, blocks, wait)
        except Exception:  # noqa: BLE001 - eviction must go on whatever the tier does
            log.exception("KV %s tier: staging evicted blocks failed", self.kind)
            with self.lock:
                self.drops["error"] += len(blocks)
            return 0

    def _spill(self, namespace, tokens, start, end, blocks, wait) -> int:
        if self.full_until > self.clock():
            with self.lock:
                self.drops["disk_full"] += len(blocks)
            return 0
        space = space_key(namespace)
        addresses = block_addresses(self.root(namespace), tokens, start, end, self.block_size)
        with self.lock:
            todo = [(a, b) for a, b in zip(addresses, blocks)
                    if a.digest not in self.index and a.digest not in self.pending]
        staged = 0
        for chunk in self._chunks(todo):
            if not self._stage(space, chunk, wait):
                with self.lock:
                    self.drops["backlog"] += len(todo) - staged
                break
            staged += len(chunk)
        return staged

    def _chunks(self, todo: list) -> list[list]:
        """``todo`` in pieces of at most a quarter of the staging buffer (at least one
        block each), so a long evicted range is staged as room allows."""
        limit = max(1, self.staging_limit // 4 // self.record_bytes(self.block_size))
        return [todo[i:i + limit] for i in range(0, len(todo), limit)]

    def _stage(self, space: str, chunk: list, wait: bool) -> bool:
        """Copy ``chunk``'s blocks into a staging tensor and queue it; False when there is
        no room (``wait``: until there is)."""
        nbytes = sum(self.record_bytes(a.count) for a, _ in chunk)
        with self.lock:
            fits = lambda: (self.staged_bytes + nbytes <= self.staging_limit  # noqa: E731
                            or not self.staged_bytes)
            if wait:
                self.room.wait_for(fits)
            elif not fits():
                return False
            fresh = [(a, b) for a, b in chunk if a.digest not in self.pending]
            self.pending.update(a.digest for a, _ in fresh)
            nbytes = sum(self.record_bytes(a.count) for a, _ in fresh)
            self.staged_bytes += nbytes
            epoch = (self.epoch, self.epochs.get(space, 0))
        if not fresh:
            return True
        try:
            parts = self.kv.gather_blocks([b for _, b in fresh])
            window = self.kv.window
            windowed = [window is None or window.has(b) for _, b in fresh]
        except BaseException:
            self.release_staged([a.digest for a, _ in fresh], nbytes)
            raise
        with self.lock:
            for i, (a, _) in enumerate(fresh):
                self.staged.add(TierRecord(a.digest, space, a.parent, a.count,
                                           self.record_bytes(a.count), a.full))
                self.staged_parts[a.digest] = (parts, i, windowed[i])
        self.write_queue.put(StagedWrite(space, epoch, [a for a, _ in fresh], parts, nbytes,
                                         windowed))
        return True

    def staged_copy(self, digest: bytes, count: int) -> tuple[list, bool] | None:
        """A staged block's parts (``[layers, count, bytes per slot]`` each) and whether
        they hold the window layers' K/V, or None when it is not staged (written, dropped or
        purged since)."""
        with self.lock:
            found = self.staged_parts.get(digest)
        if found is None:
            return None
        parts, i, windowed = found
        return [part[i, :, :count] for part in parts], windowed

    def touch_run(self, run: TierRun) -> None:
        """``run``'s records become the most recently used: call it before evicting memory
        for a load, so the writes of what that eviction spills push out other records, not
        the ones the load is about to read."""
        with self.lock:
            now = self.clock()
            for record in run.records:
                if self.index.get(record.digest) is record:
                    self.index.touch(record.digest, now)

    def load(self, run: TierRun, blocks: list[int]) -> LoadTicket:
        """Queue ``run``'s records into ``blocks`` (one per record, the caller's own); the
        caller touched the run first (``touch_run``, before making room for it)."""
        ticket = LoadTicket(run, list(blocks), self.block_size)
        with self.lock:
            self.counts["loads"] += 1
        self.load_queue.put(ticket)
        return ticket

    def count_hit(self, tokens: int) -> None:
        with self.lock:
            self.counts["hit_tokens"] += tokens

    def purge(self, namespace: str | None = None) -> int:
        """Forget ``namespace``'s records (all when None) now and delete their files in
        the writer's order (after the writes staged before); returns records forgotten."""
        with self.lock:
            if namespace is None:
                self.epoch += 1
                self.epochs.clear()
                removed = self.index.clear()
                self.staged.clear()
                self.staged_parts.clear()
                self.index.retention.clear()
                space = None
            else:
                space = space_key(namespace)
                self.epochs[space] = self.epochs.get(space, 0) + 1
                removed = self.index.remove_space(space)
                for record in self.staged.remove_space(space):
                    self.staged_parts.pop(record.digest, None)
            self.retention_dirty = True
        self.write_queue.put(Purge(space))
        return len(removed)

    def retain(self, namespace: str, tokens: Sequence[int], ttl_s: float) -> None:
        """A pin of ``tokens`` for ``ttl_s``: their blocks, stored now or later, stay in
        the tier until ``ttl_s`` after their latest hit."""
        if ttl_s <= 0 or not tokens:
            return
        addresses = block_addresses(self.root(namespace), tokens, 0, len(tokens),
                                    self.block_size)
        with self.lock:
            self.index.retain([a.digest for a in addresses], ttl_s, self.clock())
            self.retention_dirty = True

    def release(self, namespace: str, tokens: Sequence[int]) -> None:
        """An unpin: ``tokens``' blocks are no longer retained (ordinary LRU records)."""
        addresses = block_addresses(self.root(namespace), tokens, 0, len(tokens),
                                    self.block_size)
        with self.lock:
            for address in addresses:
                self.index.retention.pop(address.digest, None)
            self.retention_dirty = True

    def stats(self) -> TierStats:
        now = self.clock()
        with self.lock:
            return TierStats(
                kind=self.kind, folder=self.folder, budget_bytes=self.index.budget_bytes,
                blocks=len(self.index), bytes=self.index.nbytes,
                retained_blocks=self.index.retained_count(now),
                load_s=self.load_s, drops=MappingProxyType(dict(self.drops)),
                full=self.full_until > now, staged_bytes=self.staged_bytes, **self.counts)

    def persist(self, nodes, deadline_s: float = 60.0) -> int:
        """Stage every node of ``nodes`` (``(namespace, tokens, start, end, blocks)``
        tuples: a whole tree at shutdown), waiting for staging room; stops at the
        deadline. Returns the blocks staged."""
        stop = time.monotonic() + deadline_s
        staged = 0
        for namespace, tokens, start, end, blocks in nodes:
            if time.monotonic() > stop:
                log.warning("KV %s tier: persisting the cache ran past %.0f s; the rest is "
                            "not kept", self.kind, deadline_s)
                break
            staged += self.spill(namespace, tokens, start, end, blocks, wait=True)
        return staged

    def close(self, timeout_s: float = 120.0) -> None:
        """Finish the queued writes and loads, save the retention, release the folder."""
        self.closed = True
        self.write_queue.put(None)
        self.load_queue.put(None)
        for thread in self._threads:
            thread.join(timeout_s)
        save_retention(self, force=True)
        self.backend.close()

    def release_staged(self, digests: list[bytes], nbytes: int) -> None:
        with self.lock:
            self.pending.difference_update(digests)
            for digest in digests:
                self.staged.remove(digest)
                self.staged_parts.pop(digest, None)
            self.staged_bytes -= nbytes
            self.room.notify_all()
