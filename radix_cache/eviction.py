"""Eviction order: a heap of candidate leaves by ``EvictionPolicy.key``, a heap of leaves
whose last block is partly filled (given back first), and a heap of pin expiries.

The key is LRU's last-access tick plus two credits and minus a probation penalty
(``EvictionPolicy``); plain LRU (``LRU``) has all of them 0 and no partial-tail heap. The
heaps use lazy invalidation, so no call rescans the tree:
- the eviction heap holds ``(key, seq, node)`` and ``node.heap_key`` is the key of the
  node's newest entry. A key that grew (a hit) is fixed when its entry is popped: pushed
  again with the new key. A key that shrank (a match consumed a continuation credit) gets
  a new entry at once (``push``), and the old one is dropped when popped. An entry of a
  node that is no longer an unlocked leaf is dropped (unlock / removal of its last child
  pushes it again);
- a leaf with an unexpired pin is dropped from the LRU heap; the expiry heap hands it back
  once the pin has expired (a hit that refreshed the pin pushes a new expiry entry).
- the partial-tail heap holds ``(key, seq, node)`` for leaves whose last block is partly
  filled (``in_partials``); a popped entry whose key grew is pushed again, one that no
  longer qualifies is dropped.
Invariant (checked by ``check_integrity``): every unlocked leaf is in the LRU heap or has a
pin that is watched by the expiry heap.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import count

from .admission import on_probation
from .node import Pin, TreeNode


@dataclass(frozen=True)
class EvictionPolicy:
    """Which unlocked leaf goes first: the smallest ``key``, LRU with two credits and a
    penalty (partly filled last blocks before all of that, when ``partial_tails_first``).

    Credits are in LRU ticks (a request makes about two: its match and its insert).

    - ``continuation_ticks``: after ``RadixTree.expect_continuation`` (the cached response
      ends in a tool call, so the client will come back with the tool's result appended),
      the path counts as accessed that many ticks in the future, until the next match
      through it consumes the credit. Agent loops whose tool is still running outlive
      finished ones; the credit runs out by itself if the client never comes back.
    - ``branch_ticks``: per distinct continuation beyond the first that requests created
      below a node (``branches``; one evicted and cached again counts once), up to
      ``branch_cap`` of them, the node counts as accessed that many ticks later. A document
      or system prompt that several different questions extended outlives an equally
      recent prefix that only one conversation used; a chain of turns (one branch per
      node) gets nothing, so conversations keep plain LRU order. The cap keeps a prefix
      that stopped being used from holding memory for long.
    - ``probation_ticks``: new content below a prefix with ``probation_branches`` or more
      continuations that mostly never came back (questions under a document, one-off
      documents in a long tail) counts as that many ticks older until a match touches it
      (``admission``): it goes before the documents those questions were about.
    - ``partial_tails_first``: before any whole block is evicted, leaves give back their
      partly filled last block (LRU order among them). Such a block costs a whole block of
      memory for fewer than ``B`` tokens, all of which only the leaf's exact continuation
      can reuse, so it is the cheapest memory to give back; a hash-block cache never holds
      it at all. Without this, that cache beat token-exact matching at some budgets (the
      memory it saved outweighed the partial tokens we reuse); with it, at 1 of 560
      seed-points of the sweep, by 0.11 points.

    ``LRU`` (no credits, no probation, partial blocks in LRU order) is plain LRU. The
    defaults come from the memory sweep over five seeds, checked on five other seeds
    (benchmarks/RESULTS.md): they raise the agent and document workloads' hit rates at
    nearly every budget and cost multi-turn chat 0.2-0.8 points.
    """

    continuation_ticks: int = 200
    branch_ticks: int = 64
    partial_tails_first: bool = True
    branch_cap: int = 4
    probation_ticks: int = 1000
    probation_branches: int = 4

    def __post_init__(self) -> None:
        if min(self.continuation_ticks, self.branch_ticks, self.probation_ticks) < 0:
            raise ValueError("eviction credits must be >= 0 (0: none)")
        if self.branch_cap < 1 or self.probation_branches < 2:
            raise ValueError("branch_cap must be >= 1 and probation_branches >= 2")

    def key(self, node: TreeNode) -> float:
        key = max(node.last_access, node.expected_access)
        if node.branches > 1:
            key += self.branch_ticks * min(node.branches - 1, self.branch_cap)
        if node.probation and on_probation(self, node):
            key -= self.probation_ticks
        return key


LRU = EvictionPolicy(0, 0, partial_tails_first=False, probation_ticks=0)


class EvictionQueue:
    def __init__(self, policy: EvictionPolicy = EvictionPolicy(), block_size: int = 16):
        self.policy = policy
        self.block_size = block_size
        self._lru: list[tuple[float, int, TreeNode]] = []
        self._partials: list[tuple[float, int, TreeNode]] = []
        self._expiries: list[tuple[float, int, TreeNode, Pin]] = []
        self._seq = count()

    def push(self, node: TreeNode) -> None:
        """Offer a (possibly) evictable leaf; a no-op if it is already queued with a key no
        larger than its current one."""
        key = self.policy.key(node)
        if not node.in_heap or key < node.heap_key:
            node.in_heap = True
            node.heap_key = key
            heapq.heappush(self._lru, (key, next(self._seq), node))
        if not node.in_partials and self._has_partial_tail(node):
            node.in_partials = True
            heapq.heappush(self._partials, (key, next(self._seq), node))

    def _has_partial_tail(self, node: TreeNode) -> bool:
        """An evictable-looking leaf whose last block is partly filled and can come off
        (a leaf always keeps its first block)."""
        return (self.policy.partial_tails_first and node.end % self.block_size != 0
                and len(node.blocks) > 1 and not node.children and node.lock_ref == 0)

    def pop_partial_tail(self, now: float) -> TreeNode | None:
        """The unlocked, unpinned leaf with a partly filled last block and the smallest key,
        or None when there is none."""
        partials = self._partials
        while partials:
            key, _, node = heapq.heappop(partials)
            node.in_partials = False
            if not node.alive or not self._has_partial_tail(node):
                continue
            if node.pin is not None:
                if node.pin.expiry <= now:
                    continue                # goes whole, as a ttl eviction
                self.watch_pin(node, node.pin)
                continue                    # comes back through release_expired
            current = self.policy.key(node)
            if current > key:               # touched since it was queued
                node.in_partials = True
                heapq.heappush(partials, (current, next(self._seq), node))
                continue
            return node
        return None

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
        """The evictable leaf with the smallest key, or None when there is none."""
        lru = self._lru
        while lru:
            key, _, node = heapq.heappop(lru)
            if key != node.heap_key:
                continue                    # superseded by a newer entry with a smaller key
            node.in_heap = False
            if not node.alive or node.children or node.lock_ref:
                continue
            if key != self.policy.key(node):
                self.push(node)
                continue
            pin = node.pin
            if pin is not None and pin.expiry > now:
                self.watch_pin(node, pin)   # comes back through release_expired
                continue
            return node
        return None

    def compact(self) -> None:
        """Drop entries of removed nodes, superseded entries and dropped pins (after a
        flush, or when the heaps have grown well past the tree), keeping each live entry
        and its flag."""
        lru = [entry for entry in self._lru if entry[2].alive and entry[0] == entry[2].heap_key]
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
        partials = [entry for entry in self._partials if entry[2].alive]
        for entry in self._partials:
            if not entry[2].alive:
                entry[2].in_partials = False
        heapq.heapify(lru)
        heapq.heapify(expiries)
        heapq.heapify(partials)
        self._lru, self._expiries, self._partials = lru, expiries, partials

    def size(self) -> int:
        """Entries in all heaps (live or stale)."""
        return len(self._lru) + len(self._expiries) + len(self._partials)

    def __len__(self) -> int:
        return len(self._lru)
