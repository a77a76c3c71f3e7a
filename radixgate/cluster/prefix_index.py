"""An approximate global index of which replica caches which KV block.

Keys are the block event ids of KV events (``radixgate/kv/events/blocks.py``: chained content
hashes, so a block id stands for the whole token prefix up to its block's end, in its
namespace). Two kinds of entries:

- **stored**: a replica announced the block (``BlockStored``) and has not removed it
  (``BlockRemoved``; ``AllBlocksCleared``, which also starts a resync's snapshot, so the
  blocks a replica no longer holds leave with it; or the replica left: ``drop_replica``);
- **routed**: the router just sent a prompt with that block to the replica, whose events
  have not arrived yet (its prefill is still running). Such an entry lasts ``routed_ttl``
  (seconds of the index's clock) unless a ``BlockStored`` confirms it, so requests with
  the same prefix that arrive together are kept together, and a guess never outlives
  the time the replica had to confirm it.

``match(ids, replicas)`` gives, per replica, how many leading blocks of a prompt it holds
(a run from the first block: a block without its predecessor serves nothing). Pure Python.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Sequence

from radixgate.kv.events.wire import (WINDOW_MEDIUM, AllBlocksCleared, BlockRemoved,
                                      BlockStored, KVEvent)

Replica = Hashable


class PrefixIndex:
    def __init__(self, routed_ttl: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.routed_ttl = routed_ttl
        self.clock = clock
        self._stored: dict[int, set[Replica]] = {}
        self._routed: dict[int, dict[Replica, float]] = {}     # block -> replica -> expiry
        self._by_replica: dict[Replica, set[int]] = {}          # stored blocks per replica
        self._routed_count = 0

    # -- feeding ----------------------------------------------------------------------
    def apply(self, replica: Replica, events: Iterable[KVEvent]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self._store(replica, event.block_hashes)
            elif isinstance(event, BlockRemoved) and event.medium != WINDOW_MEDIUM:
                self._remove(replica, event.block_hashes)   # (window data: the replica backs off)
            elif isinstance(event, AllBlocksCleared):
                self._clear_stored(replica)

    def note_routed(self, replica: Replica, ids: Sequence[int]) -> None:
        """``replica`` was sent a prompt whose full blocks are ``ids``."""
        expiry = self.clock() + self.routed_ttl
        stored = self._by_replica.get(replica, ())
        for block in ids:
            if block not in stored:
                holders = self._routed.setdefault(block, {})
                self._routed_count += replica not in holders
                holders[replica] = expiry
        if self._routed_count > 4 * (len(self._stored) + 1024):
            self._prune_routed()

    def drop_replica(self, replica: Replica) -> None:
        """Forgets everything about ``replica`` (it died or left)."""
        self._clear_stored(replica)
        for block in [b for b, h in self._routed.items() if replica in h]:
            self._drop_routed(block, replica)

    def _clear_stored(self, replica: Replica) -> None:
        """Drops what ``replica`` announced; routing notes of its prefills in flight stay
        (they expire, or its next ``BlockStored`` confirms them)."""
        for block in self._by_replica.pop(replica, ()):
            holders = self._stored[block]
            holders.discard(replica)
            if not holders:
                del self._stored[block]

    def _store(self, replica: Replica, ids: Sequence[int]) -> None:
        mine = self._by_replica.setdefault(replica, set())
        for block in ids:
            self._stored.setdefault(block, set()).add(replica)
            mine.add(block)
            if replica in self._routed.get(block, ()):
                self._drop_routed(block, replica)

    def _remove(self, replica: Replica, ids: Sequence[int]) -> None:
        mine = self._by_replica.get(replica)
        for block in ids:
            holders = self._stored.get(block)
            if holders is not None and replica in holders:
                holders.discard(replica)
                if not holders:
                    del self._stored[block]
                if mine is not None:
                    mine.discard(block)

    def _drop_routed(self, block: int, replica: Replica) -> None:
        holders = self._routed[block]
        del holders[replica]
        self._routed_count -= 1
        if not holders:
            del self._routed[block]

    def _prune_routed(self) -> None:
        now = self.clock()
        for block in list(self._routed):
            for replica, expiry in list(self._routed[block].items()):
                if expiry <= now:
                    self._drop_routed(block, replica)

    # -- reading ----------------------------------------------------------------------
    def match(self, ids: Sequence[int], replicas: Iterable[Replica]) -> dict[Replica, int]:
        """Leading blocks of ``ids`` that each of ``replicas`` holds (stored or routed)."""
        now = self.clock()
        alive = set(replicas)
        out = dict.fromkeys(alive, 0)
        for depth, block in enumerate(ids):
            holding = self._holders(block, now) & alive
            for replica in alive - holding:
                out[replica] = depth
            alive = holding
            if not alive:
                return out
        for replica in alive:
            out[replica] = len(ids)
        return out

    def _holders(self, block: int, now: float) -> set[Replica]:
        stored = self._stored.get(block, set())
        routed = self._routed.get(block)
        if not routed:
            return stored
        return stored | {r for r, expiry in routed.items() if expiry > now}

    def stored_blocks(self, replica: Replica) -> int:
        return len(self._by_replica.get(replica, ()))

    @property
    def num_blocks(self) -> int:
        return len(self._stored)
