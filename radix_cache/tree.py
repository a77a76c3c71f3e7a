"""RadixTree: token-exact prefix matching over refcounted, copy-on-write KV blocks.

Reference, lock and copy-on-write rules are those of DESIGN.md section 3:
- a node covering positions ``[s, e)`` holds one reference to each block for block indices
  ``s // B .. (e - 1) // B``; a split inside a block leaves parent and child both holding
  the boundary block (one reference each) and the new parent inherits the lock count;
- along a path the block for index ``j`` is the one held by the deepest node covering any
  position of block ``j``;
- ``match`` gives the caller a reference to every returned block and a lock on the path;
  ``insert`` adds references for the blocks new nodes take and never drops the caller's.
A match that ends inside a node splits it there and locks only the matched head, so the
unmatched tail stays evictable (and ``evictable_blocks`` counts exactly what eviction frees).
Only the engine thread may call into a tree (it is not thread-safe).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from . import namespaces, pins, removal, reports
from .admission import Sightings, admit_leaf
from .eviction import EvictionPolicy, EvictionQueue
from .events import CacheEvent, EventSink
from .namespaces import Namespace, NamespaceTable
from .node import TOKEN_BYTES, LockHandle, TreeNode, common_prefix_tokens, first_token
from .packing import QueryPacker
from .pin_totals import PinTotals
from .pool import BlockPool
from .stats import EVICTION_REASONS, InsertResult, MatchResult, PrefixInfo, TreeStats


class RadixTree:
    """Per-namespace radix trees over one ``BlockPool``.

    ``clock`` (seconds) drives pin expiry only; eviction order (``policy``: LRU plus
    credits for expected continuations and for branching prefixes) uses a logical tick
    bumped by every match and insert. ``on_event`` receives a ``CacheEvent`` for each node
    stored or removed. Counters read by the engine: ``evictable_blocks`` (own blocks of unlocked
    nodes, pinned ones included), ``handles`` (live lock handles), ``pinned_nodes``.
    """

    def __init__(self, pool: BlockPool, clock: Callable[[], float] = time.monotonic,
                 on_event: EventSink | None = None,
                 policy: EvictionPolicy = EvictionPolicy()):
        self.pool = pool
        self.block_size = pool.block_size
        self.clock = clock
        self.on_event = on_event
        self.namespaces = NamespaceTable()
        self.queue = EvictionQueue(policy, pool.block_size)
        self.packer = QueryPacker()
        self.handles: set[LockHandle] = set()     # handles holding at least one lock
        self.pinned_nodes: set[TreeNode] = set()
        self.pin_totals = PinTotals()              # what unexpired pins hold, kept current
        self.tick = 0                              # logical LRU clock
        self.num_nodes = 0
        self.cached_tokens = 0
        self.evictable_tokens = 0                  # tokens of unlocked nodes
        self.locked_tokens = 0
        self.evictable_blocks = 0                  # own blocks of unlocked nodes
        self.block_holders: dict[int, int] = {}    # block -> number of nodes holding it
        self.evictions = dict.fromkeys(EVICTION_REASONS, 0)
        self.evicted_tokens = dict.fromkeys(EVICTION_REASONS, 0)
        self.sightings = Sightings()               # contents inserted as new leaves

    # ---- match / insert -------------------------------------------------------------

    def match(self, namespace: str, tokens: Sequence[int]) -> MatchResult:
        """Longest token-exact cached prefix of ``tokens`` in ``namespace``.

        Contract: the caller now holds one reference to each returned block (drop each with
        ``pool.decref`` when done) and the path is locked until ``unlock(result.handle)``.
        The blocks are safe to read only up to ``length``; if ``last_block_partial``, copy
        the last block before writing. Every node touched counts a hit, moves to the back
        of the LRU order and refreshes its pin's expiry. A match ending inside a node splits
        it at ``length`` (as the caller's insert would) and locks only the head.
        """
        ns = self.namespaces.get_or_create(namespace)
        self.tick += 1
        node, length, blocks = self._descend_for_match(ns.root, tokens, self.packer.pack(tokens))
        if length < node.end:
            node = self._split(node, length)    # the unmatched tail stays evictable
        ns.queries += 1
        ns.query_tokens += len(tokens)
        ns.hit_tokens += length
        self.pool.incref_held(blocks)
        handle = LockHandle(node)
        self.lock(handle)
        return MatchResult(length, blocks, handle, length % self.block_size != 0)

    def _descend_for_match(self, node: TreeNode, tokens: Sequence[int], data: bytes):
        B, tick, n = self.block_size, self.tick, len(tokens)
        blocks: list[int] = []
        pos = 0
        now = None
        while pos < n:
            child = node.children.get(tokens[pos])
            if child is None:
                break
            if data.startswith(child.key, pos * TOKEN_BYTES):
                pos = child.end
            else:
                pos += common_prefix_tokens(child.key, data, pos * TOKEN_BYTES)
            take = (pos - 1) // B - child.start // B + 1
            del blocks[child.start // B:]
            blocks.extend(child.blocks[:take])
            child.last_access = tick
            child.hits += 1
            child.probation = False
            if child.pin is not None:
                now = self.clock() if now is None else now
                pins.refresh(self, child, now)
            parent, node = node, child
            if pos < child.end:
                break                           # stopped inside: not its continuation
            child.expected_access = 0           # the expected continuation (if any) came
            child.passes += 1
            if child.end - child.start >= B:
                parent.child_reuses += 1        # a whole continuation came back
        return node, pos, blocks

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
        self.tick += 1
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
            child.last_access = self.tick
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

    def _hold_references(self, blocks: Sequence[int]) -> None:
        """One more node holds each of ``blocks``: a pool reference and a holder count (the
        twin of ``removal.drop_references``)."""
        self.pool.incref_many(blocks)
        holders = self.block_holders
        for block in blocks:
            holders[block] = holders.get(block, 0) + 1

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
        self.pin_totals.swap_block(node, old, block)
        self._hold_references([block])
        removal.drop_references(self, [old])
        if self.on_event is not None:
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
        leaf.last_access = self.tick
        leaf.own_blocks = leaf.count_own_blocks()
        if parent.parent is not None:
            parent.record_branch(first_token(key))
            admit_leaf(self.queue.policy, self.sightings, parent, leaf, data)
        parent.children[first_token(key)] = leaf
        self._count_node(leaf, +1)
        self.queue.push(leaf)
        if self.on_event is not None:
            self.on_event(CacheEvent("stored", parent.ns.name, tuple(taken), start, end))
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
        upper.lock_ref, upper.last_access, upper.hits = node.lock_ref, node.last_access, node.hits
        upper.expected_access = node.expected_access
        upper.child_reuses = node.passes        # its one continuation so far came back that often
        node.parent.children[first_token(node.key)] = upper
        node.key = node.key[cut:]
        node.blocks = node.blocks[at // B - first_index:]
        node.start, node.parent = at, upper
        upper.children[first_token(node.key)] = node
        upper.record_branch(first_token(node.key))
        self.pin_totals.adopt_split(upper, node)
        self.pin_totals.rehold(node, old_blocks)
        if at % B:
            self._hold_references([node.blocks[0]])
        upper.own_blocks = upper.count_own_blocks()
        node.own_blocks = node.count_own_blocks()
        self.num_nodes += 1
        node.ns.nodes += 1
        return upper

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
                    self.queue.push(node)
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
        ends in a tool call): every node on their cached path counts as accessed
        ``policy.continuation_ticks`` ticks from now; a node where ``tokens`` diverge inside
        is another request's and is left alone. Touches no hit or LRU counter and locks
        nothing. Returns how many of ``tokens`` the marked path covers (0: nothing marked)."""
        ns = self.namespaces.get(namespace)
        if ns is None:
            return 0
        path, length = pins.walk(ns.root, tokens)
        if path and length < min(path[-1].end, len(tokens)):
            path.pop()              # diverges inside it: another request's tail, not ours
        until = self.tick + self.queue.policy.continuation_ticks
        for node in path:
            node.expected_access = max(node.expected_access, until)
        return min(length, path[-1].end) if path else 0

    def evict(self, num_blocks: int) -> int:
        """Evict unlocked leaves, smallest ``policy.key`` first (least recently used, with
        credits for expected continuations and branching prefixes; with
        ``policy.partial_tails_first``, leaves first give back their partly filled last
        blocks, in the same order), until ``num_blocks``
        own blocks are freed or nothing evictable is left; returns the blocks that went back
        to the pool. A leaf larger than what is still needed loses only its tail (whole blocks;
        its prefix stays cached and matchable) instead of all of it, so eviction frees no
        more than it must. Leaves with an unexpired pin are skipped; an evicted expired pin
        counts as a ``ttl`` eviction, everything else as ``lru``.
        """
        now = self.clock()
        if self.queue.size() > 2 * self.num_nodes + 1024:
            self.queue.compact()
        self.queue.release_expired(now)
        freed = 0
        while freed < num_blocks:
            partial = self.queue.pop_partial_tail(now)
            if partial is not None:
                if self.block_holders.get(partial.blocks[-1]) == 1:
                    freed += removal.trim_leaf(self, partial, 1, "lru")
                continue
            node = self.queue.pop(now)
            if node is None:
                break
            still_needed = num_blocks - freed
            if removal.trimmable_blocks(node) >= still_needed:
                freed += removal.trim_leaf(self, node, still_needed, "lru")
            else:
                freed += removal.remove_leaf(self, node, "ttl" if node.pin is not None else "lru")
        return freed

    def flush(self, namespace: str | None = None) -> int:
        """Evict every unlocked node of ``namespace`` (all namespaces when None), pinned
        ones included, and drop every pin there; returns the blocks freed."""
        freed = 0
        for ns in self.namespaces.select(namespace):
            freed += removal.flush_below(self, ns.root)
        self.queue.compact()
        return freed

    # ---- pins, reports, integrity (see pins.py, reports.py, integrity.py) -------------

    def pin(self, namespace: str, tokens: Sequence[int], ttl_s: float, owner: str = "") -> int:
        """Pin the node at the longest cached prefix of ``tokens`` (split off if needed)
        for ``ttl_s`` seconds after each hit; returns the pinned length (0: nothing cached).
        Re-pinning the same node replaces its pin. Quotas are the caller's to enforce
        (see ``pinned_tokens(owner)``)."""
        return pins.pin(self, namespace, tokens, ttl_s, owner)

    def unpin(self, namespace: str, tokens: Sequence[int]) -> bool:
        """Remove the deepest pin on the cached path of ``tokens``; False when there is none."""
        return pins.unpin(self, namespace, tokens)

    def pinned_tokens(self, owner: str | None = None) -> int:
        """Distinct tokens on paths to unexpired pins (of ``owner``, or of everyone).
        Kept current as pins come and go: no walk over the pins."""
        totals = self._settled_pin_totals()
        return totals.tokens if owner is None else totals.tokens_by_owner.get(owner, 0)

    def pinned_block_count(self) -> int:
        """Number of distinct blocks held by nodes on paths to unexpired pins."""
        return len(self._settled_pin_totals().block_holders)

    def pinned_blocks(self) -> set[int]:
        """Distinct blocks held by nodes on paths to unexpired pins (a copy)."""
        return set(self._settled_pin_totals().block_holders)

    def _settled_pin_totals(self) -> PinTotals:
        self.pin_totals.settle(self.clock())
        return self.pin_totals

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

    # ---- namespace lifetime (see namespaces.py) ---------------------------------------

    def open_namespace(self, namespace: str, tenant: str,
                       max_namespaces: int | None = None) -> Namespace:
        """A request of ``tenant`` will use ``namespace``: it stays alive until the matching
        ``close_namespace``; the tenant's least recently opened idle namespaces beyond
        ``max_namespaces`` are evicted (unlocked, unpinned content) and dropped."""
        return namespaces.open_namespace(self, namespace, tenant, max_namespaces)

    def close_namespace(self, namespace: str) -> None:
        """The request that opened ``namespace`` is done (call after its last insert and
        unlock); an unused namespace is dropped."""
        namespaces.close_namespace(self, namespace)

    def check_integrity(self, extra_holders: Iterable[Sequence[int]] = ()) -> None:
        """Recount every holder, refcount, lock and counter; raise IntegrityError on a
        mismatch. ``extra_holders``: the block tables of everyone else holding references
        (running requests, blocks a caller got from ``match`` and still holds)."""
        from .integrity import check_tree

        check_tree(self, extra_holders)

    def namespace(self, name: str) -> Namespace | None:
        return self.namespaces.get(name)

    def peek_length(self, namespace: str, tokens: Sequence[int]) -> int:
        """Cached prefix length of ``tokens``; read-only: no lock, reference, hit or LRU touch."""
        ns = self.namespaces.get(namespace)
        return 0 if ns is None else pins.walk(ns.root, tokens)[1]
