"""The lower-tier protocol: KV blocks kept below memory (disk, host RAM, other replicas)
and loaded back into memory blocks on a later hit.

The ``KVManager`` is handed one ``LowerTier`` at construction and talks to it only through
these methods; the tree is handed ``spill_to(tier)`` (its eviction hook) at construction.
A tier is reached only from the engine thread, except ``LoadJob.done``, which its loader
sets; its methods never raise into the engine (a failure is counted, the blocks recomputed).

- **look up**: ``holds_namespace``, ``chain`` (the full-block hashes of a prompt, kept by
  the caller while the prompt is unchanged), ``find`` (the stored run extending a memory
  match of ``first_index`` blocks, a ``TierRun``);
- **load**: ``touch_run`` (before the evictions that make room for it), ``load`` (a
  ``LoadJob`` filling the caller's fresh blocks; the blocks are the loader's until ``done``
  is set, or after ``cancel()`` + ``wait()``), ``count_hit``;
- **spill**: ``spill`` (blocks of a path about to be freed: copied out at once), ``persist``
  (a whole tree at shutdown);
- **forget**: ``purge`` (a flush), ``retain`` / ``release`` (a pin's retention), ``close``
  (after it, ``spill`` stages nothing).
"""
from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from radixgate.plural import plural

from .index import TierRun

log = logging.getLogger(__name__)


class LoadJob(Protocol):
    """One request's load (``LowerTier.load``): ``loaded`` records of ``run`` are in (in
    order) once ``done`` is set; ``unwindowed``: indices of those that lacked window-layer
    K/V; ``length``: tokens from position 0 valid once done."""

    run: TierRun
    done: threading.Event
    loaded: int
    unwindowed: list[int]

    @property
    def length(self) -> int: ...

    def cancel(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class LowerTier(Protocol):
    kind: str           # names the tier in logs and hit counts ("disk", ...)
    block_size: int

    # -- look up --------------------------------------------------------------------------
    def holds_namespace(self, namespace: str) -> bool: ...

    def chain(self, namespace: str, tokens: Sequence[int]) -> list[bytes]: ...

    def find(self, namespace: str, tokens: Sequence[int], first_index: int,
             chain: Sequence[bytes]) -> TierRun | None: ...

    # -- load -----------------------------------------------------------------------------
    def touch_run(self, run: TierRun) -> None: ...

    def load(self, run: TierRun, blocks: list[int]) -> LoadJob: ...

    def count_hit(self, tokens: int) -> None: ...

    # -- spill ----------------------------------------------------------------------------
    def spill(self, namespace: str, tokens: Sequence[int], start: int, end: int,
              blocks: Sequence[int], wait: bool = False) -> int: ...

    def persist(self, nodes: Iterable[tuple]) -> int: ...

    # -- forget ---------------------------------------------------------------------------
    def purge(self, namespace: str | None = None) -> int: ...

    def retain(self, namespace: str, tokens: Sequence[int], ttl_s: float) -> None: ...

    def release(self, namespace: str, tokens: Sequence[int]) -> None: ...

    def stats(self): ...

    def close(self) -> None: ...


def spill_path(tier: LowerTier, node, start: int, end: int, blocks) -> int:
    """The tree's eviction hook (``RadixTree(spill=...)``): stage the blocks of ``[0, end)``
    along ``node``'s path that the tier lacks, not only the node's own: an evicted leaf's
    parent may stay in memory, shared and hot, until a ``kill -9``, and a stored run is only
    ever found from block 0. Returns blocks staged."""
    return tier.spill(node.ns.name, node.path_tokens(), 0, end,
                      node.path_blocks(tier.block_size))


def spill_to(tier: LowerTier | None) -> Callable | None:
    """The eviction hook a tree built over ``tier`` is handed (None without a tier)."""
    return None if tier is None else functools.partial(spill_path, tier)


def write_through(tier: LowerTier, tree, namespace: str, tokens) -> int:
    """Stage the cached prefix of ``tokens`` (a long pin's prefix) now, so it is in the
    tier within its writer's next write and survives a crash, not only a clean shutdown."""
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


def close_tier(tier: LowerTier, tree) -> None:
    """Keep everything the tree holds in the tier (a restart finds it), then close it."""
    try:
        staged = tier.persist(tree_nodes(tree))
        log.info("KV %s tier: %s of the cache kept at shutdown", tier.kind,
                 plural(staged, "block"))
    finally:
        tier.close()


def block_tiers(tree, tier: LowerTier | None, namespace: str, tokens) -> list[str]:
    """Where each block of the cached prefix of ``tokens`` lives: ``"memory"`` (a tree
    node holds it), ``"disk"`` (the tier's index holds its record) or ``"both"``; the list
    ends at the first block cached in neither. Reads only (no lock, hit or LRU touch)."""
    B = tree.block_size
    memory = tree.peek_length(namespace, tokens)
    run = None
    if tier is not None and tier.holds_namespace(namespace):
        run = tier.find(namespace, tokens, 0, tier.chain(namespace, tokens))
    below = len(run.records) if run is not None else 0
    out = []
    for index in range(-(-len(tokens) // B)):
        where = (("memory",) if index * B < memory else ()) + (("disk",) if index < below else ())
        if not where:
            break
        out.append("both" if len(where) == 2 else where[0])
    return out


__all__ = ["LoadJob", "LowerTier", "block_tiers", "close_tier", "spill_path", "spill_to",
           "tree_nodes", "write_through"]
