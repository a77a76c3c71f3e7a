"""How many blocks eviction could free right now: the fit check behind admission.

Read-only. ``evictable_blocks`` counts the own blocks of every unlocked node, but eviction
never takes a node on the path to an unexpired pin (only leaves go, and a pinned node never
does), and a request's match is about to lock its path: those blocks cannot make room for
it. What is left is what ``RadixTree.evict`` frees when asked for everything, except that a
block an evictable node shares with a node of another namespace (a tenant's continuation of
a ``public`` prefix) is counted although it stays held; callers treat the result as exact
and let allocation catch that rare overestimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .node import TreeNode

if TYPE_CHECKING:
    from .tree import RadixTree


def freeable_blocks(tree: RadixTree, path: Sequence[TreeNode] = (), length: int = 0) -> int:
    """Blocks eviction could free now, after a match of ``length`` tokens along ``path``
    (the nodes a walk finds; empty: no match) has locked what it covers."""
    pinned = unlocked_pinned_path_nodes(tree)
    held = sum(node.own_blocks for node in pinned)
    for node in path:
        if node.lock_ref == 0 and node not in pinned:
            held += head_own_blocks(node, length, tree.block_size)
    return tree.evictable_blocks - held


def head_own_blocks(node: TreeNode, length: int, block_size: int) -> int:
    """Own blocks of ``node``'s part before position ``length``: all of them when ``length``
    reaches its end, else those of the head a match splits off (the tail keeps the rest,
    less the block the two halves share when the cut falls inside one)."""
    if length >= node.end:
        return node.own_blocks
    B = block_size
    tail_blocks = (node.end - 1) // B - length // B + 1
    tail_own = tail_blocks - (1 if length % B else 0)
    return node.own_blocks - tail_own


def unlocked_pinned_path_nodes(tree: RadixTree) -> set[TreeNode]:
    """Unlocked nodes on the paths to unexpired pins (eviction never takes them)."""
    now = tree.clock()
    seen: set[TreeNode] = set()
    for pinned in tree.pins.nodes:
        if pinned.pin.expiry <= now:
            continue
        node = pinned
        while node.parent is not None and node not in seen:
            seen.add(node)
            node = node.parent
    return {node for node in seen if node.lock_ref == 0}
