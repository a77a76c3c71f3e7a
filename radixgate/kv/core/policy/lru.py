"""Plain LRU: the unlocked leaf touched longest ago goes first.

A lazy heap of ``(key, seq, node)``; ``state.heap_key`` is the key of the node's newest
entry. A key that grew (a hit) is fixed when its entry is popped: pushed again with the new
key. A key that shrank gets a new entry at ``offer``, and the old one is dropped when
popped. An entry of a node that is no longer an unlocked leaf is dropped (unlock or the
removal of its last child offers it again), as is one of a pinned leaf (the tree's pins
hand it back when the pin expires). Ties go to the node queued first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from itertools import count
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..node import TreeNode


class LRUState:
    __slots__ = ("last_access", "heap_key", "in_heap")

    def __init__(self, last_access: int):
        self.last_access = last_access      # logical tick of the last match/insert touching it
        self.heap_key = 0.0                 # eviction key of its newest heap entry (if in_heap)
        self.in_heap = False


class LRUPolicy:
    """Least recently used first; ``key(node)`` is the node's last-access tick."""

    State = LRUState

    def __init__(self) -> None:
        self.tick = 0                       # logical clock, bumped by every match and insert
        self.block_size = 0                 # set by ``bind``
        self.heap: list[tuple[float, int, TreeNode]] = []
        self.seq = count()

    def bind(self, block_size: int) -> None:
        """Attach to the tree that will call it (a policy keeps one tree's state)."""
        if self.block_size:
            raise ValueError("an eviction policy serves one tree: make one per tree")
        self.block_size = block_size

    def key(self, node: TreeNode) -> float:
        return node.policy_state.last_access

    # ---- the tree's notifications ---------------------------------------------------

    def next_tick(self) -> None:
        self.tick += 1

    def on_insert(self, parent: TreeNode, leaf: TreeNode, data: bytes) -> None:
        leaf.policy_state = self.State(self.tick)
        self.offer(leaf)

    def on_touch(self, node: TreeNode) -> None:
        node.policy_state.last_access = self.tick

    def on_hit(self, parent: TreeNode, node: TreeNode, whole: bool) -> None:
        node.policy_state.last_access = self.tick

    def on_split(self, upper: TreeNode, lower: TreeNode) -> None:
        upper.policy_state = self.State(lower.policy_state.last_access)

    def on_trim(self, node: TreeNode, first_dropped_token: int) -> None:
        pass

    def on_remove(self, node: TreeNode) -> None:
        pass                                # its heap entries are dropped when popped

    def expect(self, path: Iterable[TreeNode]) -> None:
        pass                                # plain LRU ignores the hint

    # ---- the queue ------------------------------------------------------------------

    def offer(self, node: TreeNode) -> None:
        """Queue a (possibly) evictable leaf; a no-op if it is queued already with a key no
        larger than its current one."""
        state = node.policy_state
        key = self.key(node)
        if not state.in_heap or key < state.heap_key:
            state.in_heap = True
            state.heap_key = key
            heapq.heappush(self.heap, (key, next(self.seq), node))

    def pop_partial_tail(self) -> TreeNode | None:
        return None

    def pop_victim(self, protected: Callable[[TreeNode], bool]) -> TreeNode | None:
        """The evictable leaf with the smallest key, or None when there is none."""
        heap = self.heap
        while heap:
            key, _, node = heapq.heappop(heap)
            state = node.policy_state
            if key != state.heap_key:
                continue                    # superseded by a newer entry with a smaller key
            state.in_heap = False
            if not node.alive or node.children or node.lock_ref:
                continue
            if key != self.key(node):
                self.offer(node)
                continue
            if protected(node):
                continue                    # comes back through the pins' expiry
            return node
        return None

    def compact(self) -> None:
        """Drop entries of removed nodes and superseded entries, keeping each live one."""
        for entry in self.heap:
            if not entry[2].alive:
                entry[2].policy_state.in_heap = False
        self.heap = [e for e in self.heap if e[2].alive and e[0] == e[2].policy_state.heap_key]
        heapq.heapify(self.heap)

    def size(self) -> int:
        return len(self.heap)

    def is_queued(self, node: TreeNode) -> bool:
        return node.policy_state.in_heap
