"""The protocol between ``RadixTree`` and its eviction policy.

A policy object belongs to one tree (``bind``). The tree calls it as follows; no call may
change the tree's structure, and the policy reads nodes only (``key``, ``start``, ``end``,
``blocks``, ``children``, ``parent``, ``lock_ref``, ``alive``) except for the one slot it
owns, ``node.policy_state``.

- ``next_tick()`` once at the start of every match and insert (the policy's logical clock);
- ``on_insert(parent, leaf, data)`` after a new leaf was linked below ``parent`` (``data``:
  the packed tokens of the whole insert); the leaf is then an evictable candidate;
- ``on_touch(node)`` for each existing node an insert passes through;
- ``on_hit(parent, node, whole)`` for each node a match reaches (``whole``: the match went
  through all of it);
- ``on_split(upper, lower)`` after ``upper`` was cut off the top of ``lower``;
- ``on_trim(node, first_dropped_token)`` when a leaf loses its tail (offered again after);
- ``on_remove(node)`` when a node leaves the tree;
- ``offer(node)`` when ``node`` may have become an unlocked leaf (unlock, its last child
  removed, its pin dropped or expired); a no-op for a node already queued;
- ``expect(path)`` when a request extending ``path`` is expected soon;
- ``pop_partial_tail()`` / ``pop_victim(protected)``: the next leaf to give back its partly
  filled last block (a pinned one is never named), or the next leaf to evict, skipping
  leaves ``protected(node)`` says are pinned (the tree's pins hand them back, through
  ``offer``, once they expire); None when there is none. A named node is no longer queued;
- ``compact()``, ``size()`` (queue entries, stale included), ``is_queued(node)`` for the
  tree's heap hygiene and integrity check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..node import TreeNode


class EvictionPolicy(Protocol):
    def bind(self, block_size: int) -> None: ...
    def next_tick(self) -> None: ...
    def on_insert(self, parent: TreeNode, leaf: TreeNode, data: bytes) -> None: ...
    def on_touch(self, node: TreeNode) -> None: ...
    def on_hit(self, parent: TreeNode, node: TreeNode, whole: bool) -> None: ...
    def on_split(self, upper: TreeNode, lower: TreeNode) -> None: ...
    def on_trim(self, node: TreeNode, first_dropped_token: int) -> None: ...
    def on_remove(self, node: TreeNode) -> None: ...
    def offer(self, node: TreeNode) -> None: ...
    def expect(self, path: Iterable[TreeNode]) -> None: ...
    def pop_partial_tail(self) -> TreeNode | None: ...
    def pop_victim(self, protected: Callable[[TreeNode], bool]) -> TreeNode | None: ...
    def compact(self) -> None: ...
    def size(self) -> int: ...
    def is_queued(self, node: TreeNode) -> bool: ...
