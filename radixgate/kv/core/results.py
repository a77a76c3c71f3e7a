"""Result and statistics records returned by ``RadixTree`` (frozen dataclasses)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .node import LockHandle

if TYPE_CHECKING:
    from .node import TreeNode

EVICTION_REASONS = ("lru", "ttl", "flush")
SPILL_REASONS = frozenset({"lru", "ttl"})   # evictions a lower tier keeps (a flush is not kept)


@dataclass(frozen=True)
class MatchResult:
    """What ``RadixTree.match`` found.

    ``blocks`` cover ``[0, length)`` (``ceil(length / B)`` of them) and the caller holds one
    reference to each: it must ``pool.decref`` every one when done. The matched path stays
    locked (not evictable) until ``tree.unlock(handle)``. When ``last_block_partial`` the
    last block is shared and only valid up to ``length``: copy it before writing into it.
    """

    length: int
    blocks: list[int]
    handle: LockHandle
    last_block_partial: bool


@dataclass(frozen=True, slots=True)
class Probe:
    """What ``RadixTree.probe`` found: ``length`` tokens of ``tokens`` are cached in
    ``namespace``, ending in ``node`` (the tree's, read only; None: nothing cached).

    Current while ``tree.version == version`` (nothing added, removed or trimmed since;
    splits keep it valid): then ``match(namespace, tokens, probe=)`` and
    ``freeable_blocks(probe)`` reuse it instead of walking the tree again. A stale probe
    is never wrong there (``match`` walks again), only its ``length`` may be out of date.
    """

    namespace: str
    tokens: Sequence[int]
    num_tokens: int
    length: int
    node: TreeNode | None
    version: int


@dataclass(frozen=True)
class InsertResult:
    """``cached_before``: tokens already in the tree; ``handle``: set when ``insert(lock=True)``."""

    cached_before: int
    handle: LockHandle | None


@dataclass(frozen=True)
class NamespaceStats:
    nodes: int
    cached_tokens: int
    queries: int
    query_tokens: int
    hit_tokens: int
    pinned_tokens: int


@dataclass(frozen=True)
class TreeStats:
    """Counters of the whole tree.

    Tokens: ``evictable_tokens`` are tokens of unlocked nodes (pinned ones included: a pin
    protects only until it expires), ``locked_tokens`` those of locked nodes
    (evictable + locked == cached), ``pinned_tokens`` the distinct tokens on paths to
    unexpired pins. Blocks: ``cached_blocks`` distinct blocks held by nodes,
    ``evictable_blocks`` own blocks of unlocked nodes, ``pinned_blocks`` distinct blocks on
    unexpired pinned paths. ``evictions`` counts evicted nodes by reason, ``evicted_tokens``
    their tokens.
    """

    nodes: int
    cached_tokens: int
    evictable_tokens: int
    locked_tokens: int
    pinned_tokens: int
    num_pins: int
    cached_blocks: int
    evictable_blocks: int
    pinned_blocks: int
    evictions: dict[str, int] = field(default_factory=dict)
    evicted_tokens: dict[str, int] = field(default_factory=dict)
    namespaces: dict[str, NamespaceStats] = field(default_factory=dict)
    num_namespaces: int = 0       # live namespaces (namespaces.py: unused ones are dropped)


@dataclass(frozen=True)
class PrefixInfo:
    """One hot prefix: the path from its namespace root to a node."""

    namespace: str
    owner: str            # the pin's owner, "" when unpinned
    tokens: tuple[int, ...]
    length: int
    hits: int
    pin_ttl_s: float      # seconds until the pin expires; 0.0 when unpinned or expired
    tenant: str = ""      # the namespace's owner (see namespaces.py), "" when unowned
