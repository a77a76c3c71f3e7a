"""Pins: keep a prefix cached for ``ttl_s`` seconds after its last hit (injectable clock).

A pin sits on one node; since eviction only takes leaves, the pin protects the node's
whole path. An expired pin is an ordinary eviction candidate (evicted with reason ``ttl``);
a hit before eviction re-arms it (``expiry = now + ttl_s``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .node import Pin, TreeNode, match_edge

if TYPE_CHECKING:
    from .tree import RadixTree


def walk(root: TreeNode, tokens: Sequence[int]) -> tuple[list[TreeNode], int]:
    """Nodes on the cached path of ``tokens`` and the matched length (the last node may be
    matched only partly: ``length < path[-1].end``). Touches nothing."""
    path, node, pos = [], root, 0
    while pos < len(tokens):
        child = node.children.get(tokens[pos])
        if child is None:
            break
        path.append(child)
        pos += match_edge(child.key, tokens, pos)
        if pos < child.end:
            break
        node = child
    return path, pos


def pin(tree: RadixTree, namespace: str, tokens: Sequence[int], ttl_s: float, owner: str) -> int:
    if ttl_s < 0:
        raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
    ns = tree.namespaces.get(namespace)
    if ns is None:
        return 0
    path, length = walk(ns.root, tokens)
    if length == 0:
        return 0
    node = path[-1]
    if length < node.end:
        node = tree._split(node, length)
    expiry = tree.clock() + ttl_s
    old = node.pin
    if old is not None:
        # re-pinned (every request repeating a breakpoint): update in place, so the expiry
        # heap gets no new entry unless the pin now ends sooner than its queued time
        if expiry < old.expiry:
            old.watched = False
        if owner != old.owner:
            tree.pin_totals.uncount(node, old)
        old.ttl_s, old.owner, old.expiry = ttl_s, owner, expiry
    else:
        node.pin = Pin(ttl_s, owner, expiry)
        tree.pinned_nodes.add(node)
    tree.queue.watch_pin(node, node.pin)
    tree.pin_totals.count(node, node.pin)
    return length


def unpin(tree: RadixTree, namespace: str, tokens: Sequence[int]) -> bool:
    ns = tree.namespaces.get(namespace)
    if ns is None:
        return False
    path, length = walk(ns.root, tokens)
    for node in reversed(path):
        if node.end <= length and node.pin is not None:
            drop(tree, node)
            return True
    return False


def refresh(tree: RadixTree, node: TreeNode, now: float) -> None:
    """A hit: the pin now expires ``ttl_s`` from ``now``."""
    pin = node.pin
    pin.expiry = now + pin.ttl_s
    tree.queue.watch_pin(node, pin)
    tree.pin_totals.count(node, pin)        # re-arms a pin that had expired


def drop(tree: RadixTree, node: TreeNode) -> None:
    """Remove ``node``'s pin; an unlocked leaf becomes an eviction candidate again."""
    tree.pin_totals.uncount(node, node.pin)
    node.pin = None
    tree.pinned_nodes.discard(node)
    if node.alive and not node.children and node.lock_ref == 0:
        tree.queue.push(node)


def pinned_path_nodes(tree: RadixTree) -> set[TreeNode]:
    """Nodes on the paths to unexpired pins, found by walking every pin's path: the
    reference that ``check_integrity`` holds ``PinTotals`` to."""
    now = tree.clock()
    seen: set[TreeNode] = set()
    for node in tree.pinned_nodes:
        if node.pin.expiry > now:
            seen.update(pinned_path_nodes_of(node))
    return seen


def pinned_path_nodes_of(node: TreeNode) -> list[TreeNode]:
    """``node`` and its ancestors, namespace root excluded."""
    path = []
    while node.parent is not None:
        path.append(node)
        node = node.parent
    return path
