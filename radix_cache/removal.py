"""Taking nodes out of the tree: one evicted leaf at a time, or a whole flushed subtree."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import pins
from .events import CacheEvent
from .node import TreeNode, first_token

if TYPE_CHECKING:
    from .tree import RadixTree


def remove_leaf(tree: RadixTree, node: TreeNode, reason: str) -> int:
    """Take an unlocked leaf out of the tree: drop its references (and pin), update every
    counter, emit ``removed``, offer its parent for eviction. Returns blocks freed."""
    parent = node.parent
    del parent.children[first_token(node.key)]
    freed = tree.pool.decref_many(node.blocks)
    holders = tree.block_holders
    for block in node.blocks:
        if holders[block] == 1:
            del holders[block]
        else:
            holders[block] -= 1
    tree._count_node(node, -1)
    node.alive = False
    if node.pin is not None:
        pins.drop(tree, node)
    tree.evictions[reason] += 1
    tree.evicted_tokens[reason] += node.num_tokens
    if tree.on_event is not None:
        tree.on_event(CacheEvent("removed", node.ns.name, tuple(node.blocks),
                                 node.start, node.end, reason))
    if parent.parent is not None and not parent.children and parent.lock_ref == 0:
        tree.queue.push(parent)
    return freed


def flush_below(tree: RadixTree, root: TreeNode) -> int:
    """Remove every unlocked node below ``root`` (children first) and drop every pin there."""
    freed = 0
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            if node.lock_ref == 0 and node.parent is not None:
                freed += remove_leaf(tree, node, "flush")
            elif node.pin is not None:
                pins.drop(tree, node)
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in node.children.values())
    return freed
