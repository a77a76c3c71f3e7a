"""Read-only views of a tree: ``stats()`` and ``top_prefixes()``."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from .stats import NamespaceStats, PrefixInfo, TreeStats

if TYPE_CHECKING:
    from .node import TreeNode
    from .tree import RadixTree


def tree_stats(tree: RadixTree) -> TreeStats:
    pinned = tree._settled_pin_totals()
    pinned_by_ns = pinned.tokens_by_namespace
    namespaces = {
        ns.name: NamespaceStats(ns.nodes, ns.cached_tokens, ns.queries, ns.query_tokens,
                                ns.hit_tokens, pinned_by_ns.get(ns.name, 0))
        for ns in tree.namespaces
    }
    return TreeStats(
        nodes=tree.num_nodes,
        cached_tokens=tree.cached_tokens,
        evictable_tokens=tree.evictable_tokens,
        locked_tokens=tree.locked_tokens,
        pinned_tokens=pinned.tokens,
        num_pins=len(tree.pinned_nodes),
        cached_blocks=len(tree.block_holders),
        evictable_blocks=tree.evictable_blocks,
        pinned_blocks=len(pinned.block_holders),
        evictions=dict(tree.evictions),
        evicted_tokens=dict(tree.evicted_tokens),
        namespaces=namespaces,
    )


def iter_nodes(root: TreeNode):
    """Every node below ``root`` (depth first, root excluded)."""
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def top_prefixes(tree: RadixTree, n: int, namespace: str | None) -> list[PrefixInfo]:
    """Nodes with at least one hit or a pin, most hits first (ties: longer first)."""
    candidates = (node for ns in tree.namespaces.select(namespace) for node in iter_nodes(ns.root)
                  if node.hits or node.pin is not None)
    hottest = heapq.nlargest(n, candidates, key=lambda node: (node.hits, node.end))
    now = tree.clock()
    return [
        PrefixInfo(
            namespace=node.ns.name,
            owner=node.pin.owner if node.pin is not None else "",
            tokens=node.path_tokens(),
            length=node.end,
            hits=node.hits,
            pin_ttl_s=max(0.0, node.pin.expiry - now) if node.pin is not None else 0.0,
        )
        for node in hottest
    ]
