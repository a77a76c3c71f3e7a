"""Taking blocks out of the tree: an evicted leaf (whole, or its tail trimmed to a block
boundary), or a whole flushed subtree."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import pins
from .events import CacheEvent
from .node import TOKEN_BYTES, TreeNode, first_token

if TYPE_CHECKING:
    from .tree import RadixTree


def remove_leaf(tree: RadixTree, node: TreeNode, reason: str) -> int:
    """Take an unlocked leaf out of the tree: drop its references (and pin), update every
    counter, emit ``removed``, offer its parent for eviction, drop its namespace when this
    was the last node and nothing else holds it (namespaces.py). Returns blocks freed."""
    parent = node.parent
    del parent.children[first_token(node.key)]
    freed = drop_references(tree, node.blocks)
    tree._count_node(node, -1)
    node.alive = False
    if node.pin is not None:
        pins.drop(tree, node)
    if not node.ns.nodes:
        tree.namespaces.drop_if_unused(node.ns)     # its last node: drop it unless held
    tree.evictions[reason] += 1
    tree.evicted_tokens[reason] += node.num_tokens
    if tree.on_event is not None:
        tree.on_event(CacheEvent("removed", node.ns.name, tuple(node.blocks),
                                 node.start, node.end, reason))
    if parent.parent is not None and not parent.children and parent.lock_ref == 0:
        tree.queue.push(parent)
    return freed


def trimmable_blocks(leaf: TreeNode) -> int:
    """Blocks that can come off the tail of an evictable leaf while it keeps at least one
    token (its first block, which may be shared with its parent, always stays); 0 for a
    pinned leaf (an expired pin goes whole, as a ``ttl`` eviction)."""
    return 0 if leaf.pin is not None else len(leaf.blocks) - 1


def trim_leaf(tree: RadixTree, node: TreeNode, num_blocks: int, reason: str) -> int:
    """Drop the last ``num_blocks`` (1 ..= ``trimmable_blocks``) blocks of an unlocked leaf:
    its range shrinks to ``[start, end')`` with ``end'`` on a block boundary, so the cached
    prefix it still serves stays exact. Emits ``removed`` for the dropped range, counts one
    eviction, and offers the (shorter) leaf for eviction again. Returns blocks freed."""
    B = tree.block_size
    keep = len(node.blocks) - num_blocks
    new_end = (node.start // B + keep) * B
    dropped = node.blocks[keep:]
    old_end = node.end
    tree._count_node(node, -1)
    cut = (new_end - node.start) * TOKEN_BYTES
    node.branches_now_start_with(first_token(node.key[cut:]))
    node.key = node.key[:cut]
    node.blocks = node.blocks[:keep]
    node.end = new_end
    node.own_blocks = node.count_own_blocks()
    tree._count_node(node, +1)
    freed = drop_references(tree, dropped)
    tree.evictions[reason] += 1
    tree.evicted_tokens[reason] += old_end - new_end
    if tree.on_event is not None:
        tree.on_event(CacheEvent("removed", node.ns.name, tuple(dropped), new_end, old_end,
                                 reason))
    tree.queue.push(node)
    return freed


def drop_references(tree: RadixTree, blocks: list[int]) -> int:
    """Drop one node's reference to each of ``blocks`` (pool and holder counts); a block
    may have other holders: its parent at a split inside a block, or a node of another
    namespace that was inserted with the same blocks. Returns blocks freed."""
    holders = tree.block_holders
    for block in blocks:
        if holders[block] == 1:
            del holders[block]
        else:
            holders[block] -= 1
    return tree.pool.decref_many(blocks)


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
