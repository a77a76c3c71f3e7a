"""Read-only views of a tree: ``stats()`` and the hottest prefixes.

The hottest prefixes are found best-first, not by walking every node: hits never grow down
a path (a match counts a hit on every node it touches, an insert counts none, a split gives
the new parent the node's count), so a node's hits bound those of everything below it. The
search pops nodes by hits, keeps the ``n`` best so far and stops at the first node with
fewer hits than the ``n``-th best: it looks only at nodes that can still make the list and
at their children. Pinned nodes without hits come from the pin registry (bounded by the pin
quotas). At most ``MAX_VISITS_PER_PREFIX * n`` nodes are looked at per search; past that
(many nodes with exactly the same hit count) the list still holds ``n`` nodes with at least
as many hits as any left out, but a longer one among equals may be missed.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from itertools import count
from typing import TYPE_CHECKING

from .results import NamespaceStats, PrefixInfo, TreeStats

if TYPE_CHECKING:
    from .namespaces import Namespace
    from .node import TreeNode
    from .tree import RadixTree

MAX_VISITS_PER_PREFIX = 256


def tree_stats(tree: RadixTree, per_namespace: bool = True) -> TreeStats:
    pinned = tree.pins.totals(tree.clock())
    pinned_by_ns = pinned.tokens_by_namespace
    namespaces = {
        ns.name: NamespaceStats(ns.nodes, ns.cached_tokens, ns.queries, ns.query_tokens,
                                ns.hit_tokens, pinned_by_ns.get(ns.name, 0))
        for ns in tree.namespaces
    } if per_namespace else {}
    return TreeStats(
        nodes=tree.num_nodes,
        cached_tokens=tree.cached_tokens,
        evictable_tokens=tree.evictable_tokens,
        locked_tokens=tree.locked_tokens,
        pinned_tokens=pinned.tokens,
        num_pins=len(tree.pins.nodes),
        cached_blocks=len(tree.block_holders),
        evictable_blocks=tree.evictable_blocks,
        pinned_blocks=len(pinned.block_holders),
        evictions=dict(tree.evictions),
        evicted_tokens=dict(tree.evicted_tokens),
        namespaces=namespaces,
        num_namespaces=len(tree.namespaces),
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
    pinned = [node for node in tree.pinned_nodes if namespace is None or node.ns.name == namespace]
    return _infos(tree, hottest_nodes(tree.namespaces.select(namespace), pinned, n))


def top_prefixes_by_tenant(tree: RadixTree, n: int) -> dict[str, list[PrefixInfo]]:
    """For each owner of a namespace with a hit or a pin: ``top_prefixes`` over that owner's
    namespaces only (so one tenant's traffic never pushes another's prefixes off its list).
    One bounded search per owner; nothing walks all namespaces."""
    pinned: dict[str, list[TreeNode]] = {}
    for node in tree.pinned_nodes:
        pinned.setdefault(node.ns.tenant, []).append(node)
    out = {}
    for tenant in tree.namespaces.tenants():
        nodes = hottest_nodes(tree.namespaces.of_tenant(tenant), pinned.get(tenant, ()), n)
        if nodes:
            out[tenant] = _infos(tree, nodes)
    return out


def hottest_nodes(namespaces: Iterable[Namespace], pinned: Iterable[TreeNode],
                  n: int) -> list[TreeNode]:
    """The ``n`` nodes of ``namespaces`` with the most hits (ties: longer first), nodes
    without hits counting only when in ``pinned``; best-first (module docstring)."""
    if n <= 0:
        return []
    seq = count()
    best: list[tuple[int, int, int, TreeNode]] = []     # min-heap of the n best so far
    frontier = [(-child.hits, next(seq), child)
                for ns in namespaces for child in ns.root.children.values() if child.hits]
    heapq.heapify(frontier)
    visits = MAX_VISITS_PER_PREFIX * n
    while frontier and visits:
        negative_hits, _, node = heapq.heappop(frontier)
        if len(best) == n and -negative_hits < best[0][0]:
            break                                    # nothing left can beat the n-th best
        visits -= 1
        _offer(best, n, node, seq)
        floor = best[0][0] if len(best) == n else 1
        for child in node.children.values():
            if child.hits >= floor:
                heapq.heappush(frontier, (-child.hits, next(seq), child))
    for node in pinned:
        if not node.hits:                           # with hits: the search saw it if it counts
            _offer(best, n, node, seq)
    best.sort(key=lambda entry: (entry[0], entry[1], -entry[2]), reverse=True)
    return [entry[3] for entry in best]


def _offer(best: list, n: int, node: TreeNode, seq) -> None:
    entry = (node.hits, node.end, next(seq), node)
    if len(best) < n:
        heapq.heappush(best, entry)
    elif entry[:2] > best[0][:2]:
        heapq.heapreplace(best, entry)


def _infos(tree: RadixTree, nodes: list[TreeNode]) -> list[PrefixInfo]:
    now = tree.clock()
    return [
        PrefixInfo(
            namespace=node.ns.name,
            owner=node.pin.owner if node.pin is not None else "",
            tokens=node.path_tokens(),
            length=node.end,
            hits=node.hits,
            pin_ttl_s=max(0.0, node.pin.expiry - now) if node.pin is not None else 0.0,
            tenant=node.ns.tenant,
        )
        for node in nodes
    ]
