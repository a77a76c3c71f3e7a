"""Eviction order: an LRU heap of candidate leaves plus a heap of pin expiries.

Both heaps use lazy invalidation, so no call rescans the tree:
- the LRU heap holds ``(last_access, seq, node)``; a popped entry whose node has been
  touched since is pushed again with its new time, one that is no longer an unlocked leaf is
  dropped (unlock / removal of its last child pushes it again);
- a leaf with an unexpired pin is dropped from the LRU heap; the expiry heap hands it back
  once the pin has expired (a hit that refreshed the pin pushes a new expiry entry).
Invariant (checked by ``check_integrity``): every unlocked leaf is in the LRU heap or has a
pin that is watched by the expiry heap.
"""

from __future__ import annotations

import heapq
from itertools import count

from .node import Pin, TreeNode


class EvictionQueue:
    def __init__(self):
        self._lru: list[tuple[int, int, TreeNode]] = []
        self._expiries: list[tuple[float, int, TreeNode, Pin]] = []
        self._seq = count()

    def push(self, node: TreeNode) -> None:
        """Offer a (possibly) evictable leaf; a no-op if it is already queued."""
        if not node.in_heap:
            node.in_heap = True
            heapq.heappush(self._lru, (node.last_access, next(self._seq), node))

    def watch_pin(self, node: TreeNode, pin: Pin) -> None:
        """Track ``pin``'s expiry (a no-op if already tracked; stale times are fixed lazily)."""
        if not pin.watched:
            pin.watched = True
            heapq.heappush(self._expiries, (pin.expiry, next(self._seq), node, pin))

    def release_expired(self, now: float) -> None:
        """Move leaves whose pin has expired back to the LRU heap."""
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            _, _, node, pin = heapq.heappop(expiries)
            pin.watched = False
            if node.pin is not pin or not node.alive:
                continue
            if pin.expiry > now:           # refreshed by a hit since it was pushed
                self.watch_pin(node, pin)
            elif not node.children and node.lock_ref == 0:
                self.push(node)

    def pop(self, now: float) -> TreeNode | None:
        """The least recently used evictable leaf, or None when there is none."""
        lru = self._lru
        while lru:
            last_access, _, node = heapq.heappop(lru)
            node.in_heap = False
            if not node.alive or node.children or node.lock_ref:
                continue
            if last_access != node.last_access:
                self.push(node)
                continue
            pin = node.pin
            if pin is not None and pin.expiry > now:
                self.watch_pin(node, pin)   # comes back through release_expired
                continue
            return node
        return None

    def compact(self) -> None:
        """Drop entries of removed nodes and dropped pins (after a flush, or when the heaps
        have grown well past the tree), keeping each live entry and its flag."""
        lru = [entry for entry in self._lru if entry[2].alive]
        for entry in self._lru:
            if not entry[2].alive:
                entry[2].in_heap = False
        expiries = []
        for entry in self._expiries:
            node, pin = entry[2], entry[3]
            if node.alive and node.pin is pin:
                expiries.append(entry)
            else:
                pin.watched = False
        heapq.heapify(lru)
        heapq.heapify(expiries)
        self._lru, self._expiries = lru, expiries

    def size(self) -> int:
        """Entries in both heaps (live or stale)."""
        return len(self._lru) + len(self._expiries)

    def __len__(self) -> int:
        return len(self._lru)
