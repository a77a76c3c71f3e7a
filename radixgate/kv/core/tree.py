"""RadixTree: token-exact prefix matching over refcounted, copy-on-write KV blocks.

Reference, lock and copy-on-write rules are those of docs/ARCHITECTURE.md section 3:
- a node covering positions ``[s, e)`` holds one reference to each block for block indices
  ``s // B .. (e - 1) // B``; a split inside a block leaves parent and child both holding
  the boundary block (one reference each) and the new parent inherits the lock count;
- along a path the block for index ``j`` is the one held by the deepest node covering any
  position of block ``j``;
- ``match`` gives the caller a reference to every returned block and a lock on the path;
  ``insert`` adds references for the blocks new nodes take and never drops the caller's.
A match that ends inside a node splits it there and locks only the matched head, so the
unmatched tail stays evictable (and ``evictable_blocks`` counts exactly what eviction frees).

The tree owns its structure (match, insert, split, removal, locks); its eviction policy
(``policy/``) only orders the leaves, its ``Pins`` (pins.py) keep pinned paths and their
totals. Only the engine thread may call into a tree (it is not thread-safe).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from . import integrity, namespaces, reports, room
from ..config import CreditParams
from .events import CacheEvent, EventSink
from .namespaces import Namespace, NamespaceTable
from .node import TOKEN_BYTES, LockHandle, TreeNode, common_prefix_tokens, first_token, match_edge
from .packing import QueryPacker
from .pins import Pins
from .policy import CreditPolicy, EvictionPolicy
from .pool import BlockPool
from .results import (EVICTION_REASONS, SPILL_REASONS, InsertResult, MatchResult, PrefixInfo,
                    Probe, TreeStats)


class RadixTree:
    """Per-namespace radix trees over one ``BlockPool``.

    ``clock`` (seconds) drives pin expiry only; eviction order is ``policy``'s (one policy
    object per tree; default: the credit policy with default parameters). ``on_event``
    receives a ``CacheEvent`` for each node stored or removed (a false sink, an
    ``EventFanout`` nobody subscribed to, is skipped: no event is built). Counters read by
    the engine: ``evictable_blocks`` (own blocks of unlocked nodes, pinned ones included),
    ``handles`` (live lock handles), ``pinned_nodes``. ``version`` changes whenever a node
    is added, removed or trimmed (not at a split): a ``Probe`` is current while it is
    unchanged.
    ``spill`` (a lower KV tier's hook, or None) is called as ``spill(node, start, end,
    blocks)`` when eviction (``lru`` / ``ttl``, never a flush) is about to drop the blocks
    ``blocks`` covering ``[start, end)`` of ``node``'s path: still held and unchanged, so the
    hook can copy them out before they return to the pool. It must not raise or touch the tree.
    """

    def __init__(self, pool: BlockPool, clock: Callable[[], float] = time.monotonic,
                 on_event: EventSink | None = None, policy: EvictionPolicy | None = None,
                 spill: Callable[[TreeNode, int, int, list[int]], None] | None = None):
        self.pool = pool
        self.block_size = pool.block_size
        self.clock = clock
        self.on_event = on_event
        self.namespaces = NamespaceTable()
        self.policy = policy if policy is not None else CreditPolicy(CreditParams())
        self.policy.bind(pool.block_size)
        self.pins = Pins()
        self.packer = QueryPacker()
        self.handles: set[LockHandle] = set()     # handles holding at least one lock
        self.version = 0
        self.num_nodes = 0
        self.cached_tokens = 0
        self.evictable_tokens = 0                  # tokens of unlocked nodes
        self.locked_tokens = 0
        self.evictable_blocks = 0                  # own blocks of unlocked nodes
        self.block_holders: dict[int, int] = {}    # block -> number of nodes holding it
        self.evictions = dict.fromkeys(EVICTION_REASONS, 0)
        self.evicted_tokens = dict.fromkeys(EVICTION_REASONS, 0)
        self.spill = spill

    # ---- probe / match / insert -----------------------------------------------------

    def probe(self, namespace: str, tokens: Sequence[int]) -> Probe:
        """The cached prefix of ``tokens`` in ``namespace``, read only: no lock, reference,
        hit or LRU touch. The result stays usable (``match(..., probe=)``,
        ``freeable_blocks``) while ``version`` is unchanged; splits keep it valid."""
        ns = self.namespaces.get(namespace)
        if ns is None:
            return Probe(namespace, tokens, len(tokens), 0, None, self.version)
        path, length = self._walk(ns.root, tokens)
        return Probe(namespace, tokens, len(tokens), length, path[-1] if path else None,
                     self.version)

    def peek_length(self, namespace: str, tokens: Sequence[int]) -> int:
        """Cached prefix length of ``tokens``; read-only: no lock, reference, hit or LRU touch."""
        return self.probe(namespace, tokens).length

    def match(self, namespace: str, tokens: Sequence[int], probe: Probe | None = None) -> MatchResult:
        """Longest token-exact cached prefix of ``tokens`` in ``namespace``.

        Contract: the caller now holds one reference to each returned block (drop each with
        ``pool.decref`` when done) and the path is locked until ``unlock(result.handle)``.
        The blocks are safe to read only up to ``length``; if ``last_block_partial``, copy
        the last block before writing. Every node touched counts a hit, is reported to the
        policy and refreshes its pin's expiry. A match ending inside a node splits it at
        ``length`` (as the caller's insert would) and locks only the head. ``probe``: this
        query's current ``probe`` result, reused instead of walking the tree again.
        """
        ns = self.namespaces.get_or_create(namespace)
        self.policy.next_tick()
        if self._is_current(probe, namespace, tokens):
            path, length = self._probe_path(probe), probe.length
        else:
            path, length = self._walk(ns.root, tokens, self.packer.pack(tokens))
        blocks = self._touch_path(path, length)
        node = path[-1] if path else ns.root
        if length < node.end:
            node = self._split(node, length)    # the unmatched tail stays evictable
        ns.queries += 1
        ns.query_tokens += len(tokens)
        ns.hit_tokens += length
        self.pool.incref_held(blocks)
        handle = LockHandle(node)
        self.lock(handle)
        return MatchResult(length, blocks, handle, length % self.block_size != 0)

    def _walk(self, root: TreeNode, tokens: Sequence[int], data: bytes | None = None):
        """Nodes on the cached path of ``tokens`` and the matched length (the last node may
        be matched only partly: ``length < path[-1].end``). ``data``: ``tokens`` packed
        (else each edge's slice is packed). Touches nothing."""
        path, node, pos, n = [], root, 0, len(tokens)
        while pos < n:
            child = node.children.get(tokens[pos])
            if child is None:
                break
            path.append(child)
            if data is None:
                pos += match_edge(child.key, tokens, pos)
            elif data.startswith(child.key, pos * TOKEN_BYTES):
                pos = child.end
            else:
                pos += common_prefix_tokens(child.key, data, pos * TOKEN_BYTES)
            if pos < child.end:
                break
            node = child
        return path, pos

    def _is_current(self, probe: Probe | None, namespace: str, tokens: Sequence[int]) -> bool:
        return (probe is not None and probe.version == self.version
                and probe.namespace == namespace and probe.tokens is tokens
                and probe.num_tokens == len(tokens))

    def _probe_path(self, probe: Probe) -> list[TreeNode]:
        """The path a walk would find now for a current ``probe``: splits since moved its
        end into a new parent (the lower half keeps the node's identity)."""
        node = probe.node
        if node is None:
            return []
        while node.start >= probe.length:
            node = node.parent
        return node.path()

    def _touch_path(self, path: list[TreeNode], length: int) -> list[int]:
        """A match of ``length`` along ``path``: hits, pins and the policy told; returns
        the blocks covering ``[0, length)``."""
        B, policy = self.block_size, self.policy
        blocks: list[int] = []
        now = None
        parent = path[0].parent if path else None
        for node in path:
            end = min(node.end, length)
            del blocks[node.start // B:]
            blocks.extend(node.blocks[:(end - 1) // B - node.start // B + 1])
            node.hits += 1
            if node.pin is not None:
                now = self.clock() if now is None else now
                self.pins.refresh(node, now)
            policy.on_hit(parent, node, end == node.end)
            parent = node
        return blocks

    def insert(self, namespace: str, tokens: Sequence[int], blocks: Sequence[int],
               lock: bool = False) -> InsertResult:
        """Cache ``tokens`` whose K/V live in ``blocks`` (the caller's block table).

        ``blocks[j]`` holds block index ``j``; at least ``ceil(len(tokens) / B)`` entries.
        Nodes that already exist keep their blocks; each new node takes a reference to the
        blocks it covers. The caller's references are never dropped. With ``lock=True`` the
        node ending at ``len(tokens)`` is locked (split off if needed) and its handle
        returned: ``unlock`` it exactly once.
        """
        n, B = len(tokens), self.block_size
        if len(blocks) < -(-n // B):
            raise ValueError(f"{n} tokens need {-(-n // B)} blocks, got {len(blocks)}")
        ns = self.namespaces.get_or_create(namespace)
        data = self.packer.pack(tokens)
        self.policy.next_tick()
        node, pos = ns.root, 0
        cached_before = n
        while pos < n:
            child = node.children.get(tokens[pos])
            if child is None:
                cached_before = pos
                if pos % B and node.parent is not None:
                    self._adopt_boundary_block(node, blocks[pos // B])
                node = self._add_leaf(node, data, pos, n, blocks)
                break
            self.policy.on_touch(child)
            if data.startswith(child.key, pos * TOKEN_BYTES):
                node, pos = child, child.end
                continue
            pos += common_prefix_tokens(child.key, data, pos * TOKEN_BYTES)
            if pos == n and not lock:
                break
            node = self._split(child, pos)
        handle = None
        if lock:
            handle = LockHandle(node)
            self.lock(handle)
        elif not n:
            self.namespaces.drop_if_unused(ns)      # nothing inserted into a new namespace
        return InsertResult(cached_before, handle)

    # ---- structure: nodes and their references ---------------------------------------

    def _hold_references(self, blocks: Sequence[int]) -> None:
        """One more node holds each of ``blocks``: a pool reference and a holder count."""
        self.pool.incref_many(blocks)
        holders = self.block_holders
        for block in blocks:
            holders[block] = holders.get(block, 0) + 1

    def _drop_references(self, blocks: list[int]) -> int:
        """One node fewer holds each of ``blocks`` (a block may have other holders: its
        parent at a split inside a block, or a node of another namespace inserted with the
        same blocks). Returns blocks freed."""
        holders = self.block_holders
        for block in blocks:
            if holders[block] == 1:
                del holders[block]
            else:
                holders[block] -= 1
        return self.pool.decref_many(blocks)

    def _adopt_boundary_block(self, node: TreeNode, block: int) -> None:
        """``node`` ends inside its last block and is being extended by a request whose own
        copy of that block, ``block``, holds the same K/V up to ``node.end`` (the request
        matched ``node``'s tokens and copied the partial block before writing, or computed
        the same tokens itself). When ``node`` is the tree's only holder of its block, it
        takes ``block`` instead, so the extension shares one block with it rather than
        keeping a second copy: one block saved per turn of a conversation or agent loop."""
        old = node.blocks[-1]
        if old == block or self.block_holders.get(old) != 1:
            return                  # shared with a parent, child or other namespace: keep
        node.blocks[-1] = block
        self.pins.swap_block(node, old, block)
        self._hold_references([block])
        self._drop_references([old])
        if self.on_event:
            start = max(node.start, (node.end - 1) // self.block_size * self.block_size)
            self.on_event(CacheEvent("removed", node.ns.name, (old,), start, node.end,
                                     "replaced"))
            self.on_event(CacheEvent("stored", node.ns.name, (block,), start, node.end))

    def _add_leaf(self, parent: TreeNode, data: bytes, start: int, end: int,
                  blocks: Sequence[int]) -> TreeNode:
        """A new leaf for tokens ``[start, end)`` of the packed prompt ``data``."""
        B = self.block_size
        key = data[start * TOKEN_BYTES:]
        taken = list(blocks[start // B:(end - 1) // B + 1])
        self._hold_references(taken)
        leaf = TreeNode(key, start, end, taken, parent, parent.ns)
        leaf.own_blocks = leaf.count_own_blocks()
        parent.children[first_token(key)] = leaf
        self._count_node(leaf, +1)
        self.version += 1
        self.policy.on_insert(parent, leaf, data)
        if self.on_event:
            self.on_event(CacheEvent("stored", parent.ns.name, tuple(taken), start, end,
                                     tokens=data[:end * TOKEN_BYTES]))
        return leaf

    def _split(self, node: TreeNode, at: int) -> TreeNode:
        """Cut ``node`` at position ``at``; returns the new parent covering ``[start, at)``.

        ``node`` keeps its identity (and handles, pin) as the lower half. A cut inside a
        block leaves that block in both halves, with one more reference.
        """
        B = self.block_size
        first_index = node.start // B
        old_blocks = node.blocks
        upper_blocks = node.blocks[:(at - 1) // B - first_index + 1]
        cut = (at - node.start) * TOKEN_BYTES
        upper = TreeNode(node.key[:cut], node.start, at, upper_blocks, node.parent, node.ns)
        upper.lock_ref, upper.hits = node.lock_ref, node.hits
        node.parent.children[first_token(node.key)] = upper
        node.key = node.key[cut:]
        node.blocks = node.blocks[at // B - first_index:]
        node.start, node.parent = at, upper
        upper.children[first_token(node.key)] = node
        self.pins.split(upper, node, old_blocks)
        if at % B:
            self._hold_references([node.blocks[0]])
        upper.own_blocks = upper.count_own_blocks()
        node.own_blocks = node.count_own_blocks()
        self.num_nodes += 1
        node.ns.nodes += 1
        self.policy.on_split(upper, node)
        return upper

    def _remove_leaf(self, node: TreeNode, reason: str) -> int:
        """Take an unlocked leaf out of the tree: drop its references (and pin), update every
        counter, emit ``removed``, offer its parent for eviction, drop its namespace when this
        was the last node and nothing else holds it (namespaces.py). Returns blocks freed."""
        if self.spill is not None and reason in SPILL_REASONS:
            self.spill(node, node.start, node.end, node.blocks)
        parent = node.parent
        del parent.children[first_token(node.key)]
        freed = self._drop_references(node.blocks)
        self._count_node(node, -1)
        node.alive = False
        self.version += 1
        if node.pin is not None:
            self.pins.drop(node)
        self.policy.on_remove(node)
        if not node.ns.nodes:
            self.namespaces.drop_if_unused(node.ns)     # its last node: drop it unless held
        self.evictions[reason] += 1
        self.evicted_tokens[reason] += node.num_tokens
        if self.on_event:
            self.on_event(CacheEvent("removed", node.ns.name, tuple(node.blocks),
                                     node.start, node.end, reason))
        if parent.parent is not None and not parent.children and parent.lock_ref == 0:
            self.policy.offer(parent)
        return freed

    def _trim_leaf(self, node: TreeNode, num_blocks: int, reason: str) -> int:
        """Drop the last ``num_blocks`` (1 ..= ``len(blocks) - 1``) blocks of an unlocked,
        unpinned leaf: its range shrinks to ``[start, end')`` with ``end'`` on a block
        boundary, so the cached prefix it still serves stays exact. Emits ``removed`` for
        the dropped range, counts one eviction, and offers the (shorter) leaf for eviction
        again. Returns blocks freed."""
        B = self.block_size
        keep = len(node.blocks) - num_blocks
        new_end = (node.start // B + keep) * B
        dropped = node.blocks[keep:]
        old_end = node.end
        if self.spill is not None and reason in SPILL_REASONS:
            self.spill(node, new_end, old_end, dropped)
        self._count_node(node, -1)
        cut = (new_end - node.start) * TOKEN_BYTES
        self.policy.on_trim(node, first_token(node.key[cut:]))
        node.key = node.key[:cut]
        node.blocks = node.blocks[:keep]
        node.end = new_end
        node.own_blocks = node.count_own_blocks()
        self._count_node(node, +1)
        self.version += 1
        freed = self._drop_references(dropped)
        self.evictions[reason] += 1
        self.evicted_tokens[reason] += old_end - new_end
        if self.on_event:
            self.on_event(CacheEvent("removed", node.ns.name, tuple(dropped), new_end, old_end,
                                     reason))
        self.policy.offer(node)
        return freed

    def _remove_below(self, root: TreeNode, keep: Callable[[TreeNode], bool] | None,
                      reason: str | None) -> int:
        """Remove every unlocked node below ``root`` (children first) that ``keep`` does
        not keep. ``keep`` None (a flush): every pin there is dropped too, and ``reason``
        names the evictions; else an expired pin goes as ``ttl``, the rest as ``lru``."""
        freed = 0
        stack = [(root, False)]
        while stack:
            node, children_done = stack.pop()
            if not children_done:
                stack.append((node, True))
                stack.extend((child, False) for child in node.children.values())
            elif node.parent is None or node.children or node.lock_ref:
                if keep is None and node.pin is not None:
                    self._drop_pin(node)
            elif keep is None:
                freed += self._remove_leaf(node, reason)
            elif not keep(node):
                freed += self._remove_leaf(node, "ttl" if node.pin is not None else "lru")
        return freed

    def _count_node(self, node: TreeNode, sign: int) -> None:
        """Add (+1) or remove (-1) an unlocked node's tokens and blocks from the counters."""
        tokens = sign * node.num_tokens
        self.num_nodes += sign
        self.cached_tokens += tokens
        self.evictable_tokens += tokens
        self.evictable_blocks += sign * node.own_blocks
        node.ns.nodes += sign
        node.ns.cached_tokens += tokens

    # ---- locks ----------------------------------------------------------------------

    def lock(self, handle: LockHandle) -> None:
        """Lock the handle's path (once more); every lock needs one ``unlock``."""
        node = handle.node
        if not node.alive:
            raise ValueError(f"{handle!r} names a node that was evicted")
        while node.parent is not None:
            if node.lock_ref == 0:
                self._move_lock_state(node, locked=True)
            node.lock_ref += 1
            node = node.parent
        handle.count += 1
        handle.node.ns.locks += 1
        self.handles.add(handle)

    def unlock(self, handle: LockHandle) -> None:
        """Release one lock of ``handle``; leaves that become unlocked turn evictable."""
        if handle.count <= 0:
            raise ValueError(f"unlock of {handle!r} that holds no lock (unlocked twice?)")
        handle.count -= 1
        if handle.count == 0:
            self.handles.discard(handle)
        node = handle.node
        while node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._move_lock_state(node, locked=False)
                if not node.children:
                    self.policy.offer(node)
            node = node.parent
        handle.node.ns.locks -= 1
        if not handle.node.ns.locks:
            self.namespaces.drop_if_unused(handle.node.ns)

    def _move_lock_state(self, node: TreeNode, locked: bool) -> None:
        sign = 1 if locked else -1
        self.locked_tokens += sign * node.num_tokens
        self.evictable_tokens -= sign * node.num_tokens
        self.evictable_blocks -= sign * node.own_blocks

    # ---- eviction -------------------------------------------------------------------

    def expect_continuation(self, namespace: str, tokens: Sequence[int]) -> int:
        """A request extending ``tokens`` is expected soon (the response cached with them
        ends in a tool call): the policy is told about every node on their cached path (the
        credit policy counts them as accessed ``continuation_ticks`` from now); a node where
        ``tokens`` diverge inside is another request's and is left out. Touches no hit
        counter and locks nothing. Returns how many of ``tokens`` the marked path covers
        (0: nothing marked)."""
        ns = self.namespaces.get(namespace)
        if ns is None:
            return 0
        path, length = self._walk(ns.root, tokens)
        if path and length < min(path[-1].end, len(tokens)):
            path.pop()              # diverges inside it: another request's tail, not ours
        self.policy.expect(path)
        return min(length, path[-1].end) if path else 0

    def evict(self, num_blocks: int) -> int:
        """Evict unlocked leaves in the policy's order (partly filled last blocks first
        when it says so) until ``num_blocks`` own blocks are freed or nothing evictable is
        left; returns the blocks that went back to the pool. A leaf larger than what is
        still needed loses only its tail (whole blocks; its prefix stays cached and
        matchable) instead of all of it, so eviction frees no more than it must. Leaves with
        an unexpired pin are skipped; an evicted expired pin counts as a ``ttl`` eviction,
        everything else as ``lru``.
        """
        now = self.clock()
        self._compact_if_large()
        for node in self.pins.release_expired(now):
            self.policy.offer(node)
        protected = lambda node: self.pins.protects(node, now)  # noqa: E731
        freed = 0
        while freed < num_blocks:
            partial = self.policy.pop_partial_tail()
            if partial is not None:
                if self.block_holders.get(partial.blocks[-1]) == 1:
                    freed += self._trim_leaf(partial, 1, "lru")
                continue
            node = self.policy.pop_victim(protected)
            if node is None:
                break
            still_needed = num_blocks - freed
            trimmable = 0 if node.pin is not None else len(node.blocks) - 1
            if trimmable >= still_needed:
                freed += self._trim_leaf(node, still_needed, "lru")
            else:
                freed += self._remove_leaf(node, "ttl" if node.pin is not None else "lru")
        return freed

    def flush(self, namespace: str | None = None) -> int:
        """Evict every unlocked node of ``namespace`` (all namespaces when None), pinned
        ones included, and drop every pin there; returns the blocks freed."""
        freed = 0
        for ns in self.namespaces.select(namespace):
            freed += self._remove_below(ns.root, None, "flush")
        self.policy.compact()
        self.pins.compact()
        return freed

    def evict_unpinned(self, ns: Namespace) -> int:
        """Remove every unlocked node of ``ns`` that is not on the path to an unexpired pin
        (an expired pin goes as a ``ttl`` eviction, the rest as ``lru``); the namespace is
        dropped when that empties it and nothing else holds it. Returns blocks freed."""
        pins = self.pins
        pins.totals(self.clock())               # expired pins no longer mark their paths
        freed = self._remove_below(ns.root, pins.on_path, None)
        self._compact_if_large()
        return freed

    def _compact_if_large(self) -> None:
        """Drop stale queue entries once they outnumber the nodes (and pins) well."""
        if self.policy.size() > 2 * self.num_nodes + 1024:
            self.policy.compact()
        if len(self.pins.expiries) > 2 * len(self.pins.nodes) + 1024:
            self.pins.compact()

    def freeable_blocks(self, probe: Probe | None = None) -> int:
        """Blocks eviction could free now (room.py), after a match of the current ``probe``
        (None: no match) has locked what it covers."""
        if probe is None or not probe.length:
            return room.freeable_blocks(self)
        return room.freeable_blocks(self, self._probe_path(probe), probe.length)

    # ---- pins -----------------------------------------------------------------------

    def pin(self, namespace: str, tokens: Sequence[int], ttl_s: float, owner: str = "") -> int:
        """Pin the node at the longest cached prefix of ``tokens`` (split off if needed)
        for ``ttl_s`` seconds after each hit; returns the pinned length (0: nothing cached).
        Re-pinning the same node replaces its pin. Quotas are the caller's to enforce
        (see ``pinned_tokens(owner)``)."""
        if ttl_s < 0:
            raise ValueError(f"ttl_s must be >= 0, got {ttl_s}")
        ns = self.namespaces.get(namespace)
        if ns is None:
            return 0
        path, length = self._walk(ns.root, tokens)
        if length == 0:
            return 0
        node = path[-1]
        if length < node.end:
            node = self._split(node, length)
        self.pins.set(node, ttl_s, owner, self.clock())
        return length

    def unpin(self, namespace: str, tokens: Sequence[int]) -> bool:
        """Remove the deepest pin on the cached path of ``tokens``; False when there is none."""
        ns = self.namespaces.get(namespace)
        if ns is None:
            return False
        path, length = self._walk(ns.root, tokens)
        for node in reversed(path):
            if node.end <= length and node.pin is not None:
                self._drop_pin(node)
                return True
        return False

    def _drop_pin(self, node: TreeNode) -> None:
        """Remove ``node``'s pin; an unlocked leaf becomes an eviction candidate again."""
        self.pins.drop(node)
        if node.alive and not node.children and node.lock_ref == 0:
            self.policy.offer(node)

    @property
    def pinned_nodes(self) -> set[TreeNode]:
        """Nodes with a pin (expired ones included until evicted or re-armed)."""
        return self.pins.nodes

    def pinned_tokens(self, owner: str | None = None) -> int:
        """Distinct tokens on paths to unexpired pins (of ``owner``, or of everyone).
        Kept current as pins come and go: no walk over the pins."""
        totals = self.pins.totals(self.clock())
        return totals.tokens if owner is None else totals.tokens_by_owner.get(owner, 0)

    def pinned_block_count(self) -> int:
        """Number of distinct blocks held by nodes on paths to unexpired pins."""
        return len(self.pins.totals(self.clock()).block_holders)

    def pinned_blocks(self) -> set[int]:
        """Distinct blocks held by nodes on paths to unexpired pins (a copy)."""
        return set(self.pins.totals(self.clock()).block_holders)

    def pinned_prefix(self, namespace: str, tokens: Sequence[int], owner: str) -> int:
        """How much of ``tokens`` ``owner`` has pinned already in ``namespace``: the end of
        the deepest node on their cached path that lies on one of owner's pinned paths
        (those are prefix-closed), capped at len(tokens)."""
        self.pins.totals(self.clock())          # settles expired pins first
        ns = self.namespaces.get(namespace)
        if ns is None:
            return 0
        path, _ = self._walk(ns.root, tokens)
        for node in reversed(path):
            if self.pins.on_path(node, owner):
                return min(node.end, len(tokens))
        return 0

    # ---- reports, integrity, namespaces (reports.py, integrity.py, namespaces.py) ----

    def held_blocks(self) -> set[int]:
        """Blocks referenced by at least one node."""
        return set(self.block_holders)

    def stats(self, per_namespace: bool = True) -> TreeStats:
        """Counters of the whole tree; ``per_namespace`` False leaves ``namespaces`` empty
        (then the cost does not grow with the number of namespaces)."""
        return reports.tree_stats(self, per_namespace)

    def top_prefixes(self, n: int = 10, namespace: str | None = None) -> list[PrefixInfo]:
        """The ``n`` most hit nodes (ties: longer first), with their full token paths."""
        return reports.top_prefixes(self, n, namespace)

    def top_prefixes_by_tenant(self, n: int = 10) -> dict[str, list[PrefixInfo]]:
        """Each namespace owner's ``n`` most hit nodes, from its own namespaces only."""
        return reports.top_prefixes_by_tenant(self, n)

    def open_namespace(self, namespace: str, tenant: str,
                       max_namespaces: int | None = None) -> Namespace:
        """A request of ``tenant`` will use ``namespace``: it stays alive until the matching
        ``close_namespace``; the tenant's least recently opened idle namespaces beyond
        ``max_namespaces`` are evicted (unlocked, unpinned content) and dropped."""
        return namespaces.open_namespace(self, namespace, tenant, max_namespaces)

    def retire_namespace(self, namespace: str) -> int:
        """What a tenant's ``max_namespaces`` does to its least recently used idle namespace,
        on request (a deployment counts the cap over all its replicas: radixgate/cluster/admission.py):
        its unlocked content not on the path to an unexpired pin goes and the namespace is
        dropped once nothing holds it. A namespace a request has open is left alone.
        Returns the blocks freed."""
        ns = self.namespaces.get(namespace)
        if ns is None or ns.users or ns.locks:
            return 0
        return self.evict_unpinned(ns)

    def close_namespace(self, namespace: str) -> None:
        """The request that opened ``namespace`` is done (call after its last insert and
        unlock); an unused namespace is dropped."""
        namespaces.close_namespace(self, namespace)

    def namespace(self, name: str) -> Namespace | None:
        return self.namespaces.get(name)

    def check_integrity(self, extra_holders: Iterable[Sequence[int]] = ()) -> None:
        """Recount every holder, refcount, lock and counter; raise IntegrityError on a
        mismatch. ``extra_holders``: the block tables of everyone else holding references
        (running requests, blocks a caller got from ``match`` and still holds)."""
        integrity.check_tree(self, extra_holders)
