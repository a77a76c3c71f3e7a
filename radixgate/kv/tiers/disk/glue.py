"""The engine's side of the lower KV tier: built from ``[cache] disk_dir`` / ``disk_gb``,
fed by the tree's evictions (``RadixTree.spill``: the evicted node's whole path, so what is
on disk is always reachable from block 0), by long pins as soon as they are set
(``write_through``) and by the whole tree at shutdown."""
from __future__ import annotations

import logging

from radixgate.plural import plural

from . import open_disk_tier
from .tier import KVTier

log = logging.getLogger(__name__)


def open_tier(config, kv, tree, fingerprint, description: str) -> KVTier | None:
    """The disk tier ``config.cache`` asks for (None without ``disk_dir``), wired to
    ``tree``'s evictions; ``fingerprint()`` gives the model's 16 bytes (called only when a
    tier opens: it reads the weights)."""
    cache = config.cache
    if not cache.disk_dir:
        return None
    tier = open_disk_tier(cache, kv, fingerprint(), description=description)
    tree.spill = lambda node, start, end, blocks: spill_path(tier, node, end)
    log.info("KV disk tier at %s: %.2f GiB budget, %s held", cache.disk_dir,
             cache.disk_gb, plural(tier.stats().blocks, "block"))
    return tier


def spill_path(tier: KVTier, node, end: int) -> int:
    """Stage the blocks of ``[0, end)`` along ``node``'s path that the tier lacks, not only
    the node's own: an evicted leaf's parent may stay in memory, shared and hot, until a
    ``kill -9``, and a stored run is only ever found from block 0. Returns blocks staged."""
    return tier.spill(node.ns.name, node.path_tokens(), 0, end,
                      node.path_blocks(tier.block_size))


def write_through(tier: KVTier, tree, namespace: str, tokens) -> int:
    """Stage the cached prefix of ``tokens`` (a long pin's prefix) now, so it is on disk
    within the writer's next write and survives a crash, not only a clean shutdown."""
    probe = tree.probe(namespace, tokens)
    node = probe.node
    if node is None or probe.length == 0:
        return 0
    while node.start >= probe.length:
        node = node.parent
    blocks = node.path_blocks(tier.block_size)[:-(-probe.length // tier.block_size)]
    return tier.spill(namespace, node.path_tokens(), 0, probe.length, blocks)


def tree_nodes(tree):
    """``(namespace, path tokens, start, end, blocks)`` of every node, parents first."""
    for ns in list(tree.namespaces):
        stack = list(ns.root.children.values())
        while stack:
            node = stack.pop()
            yield ns.name, node.path_tokens(), node.start, node.end, list(node.blocks)
            stack.extend(node.children.values())


def close_tier(tier: KVTier, tree) -> None:
    """Keep everything the tree holds in the tier (a restart finds it), then close it."""
    try:
        staged = tier.persist(tree_nodes(tree))
        log.info("KV %s tier: %s of the cache kept at shutdown", tier.kind,
                 plural(staged, "block"))
    finally:
        tier.close()


def block_tiers(tree, tier: KVTier | None, namespace: str, tokens) -> list[str]:
    """Where each block of the cached prefix of ``tokens`` lives: ``"memory"`` (a tree
    node holds it), ``"disk"`` (the tier's index holds its record) or ``"both"``; the list
    ends at the first block cached in neither. Reads only (no lock, hit or LRU touch)."""
    B = tree.block_size
    memory = tree.peek_length(namespace, tokens)
    run = None
    if tier is not None and tier.holds_namespace(namespace):
        run = tier.find(namespace, tokens, 0, tier.chain(namespace, tokens))
    on_disk = len(run.records) if run is not None else 0
    out = []
    for index in range(-(-len(tokens) // B)):
        where = (("memory",) if index * B < memory else ()) + (("disk",) if index < on_disk else ())
        if not where:
            break
        out.append("both" if len(where) == 2 else where[0])
    return out
