"""A sequence's KV blocks against the radix tree: admission, copy-on-write, insert, release.

Implements docs/ARCHITECTURE.md sections 2-3 for one sequence at a time (the scheduler decides when):

- ``admit``: match (own namespace, and ``public`` when the request opts in: the longer match
  wins, the other is released), reuse ``min(matched, len - 1)`` tokens (rounded down to whole
  blocks when ``page_rounded``), drop references beyond the reuse, copy a partially reused
  last block into a private block (copy-on-write), allocate the rest (evicting unlocked cache
  when short, and only when that makes room). On failure or an exception everything taken
  is given back: the match's references and lock, the private copy.
- ``may_fit``: the same count before matching, exact (``RadixTree.freeable_blocks``): free
  blocks plus what eviction can free against the blocks admission would allocate.
- ``probe``: one read-only walk per namespace searched (``RadixTree.probe``), kept for the
  scheduling pass and reused by ``peek_length``, ``may_fit`` and ``match`` while the tree's
  ``version`` is unchanged (``forget_probes`` at every step).
- ``insert_prefilled``: the computed tokens go into the tree and the request's lock moves to
  the node ending at them (with ``page_rounded``, as a hash-block cache, whole blocks only).
- ``release``: insert what was computed (``tokens[:num_computed]``, i.e. prompt +
  output[:-1] after decoding), unlock, drop the request's references.
- With a lower tier (``tier``, radixgate/kv/tiers/disk/): ``admit`` asks it for the stored run
  extending the memory match; when that saves at least a block of prefill, the request gets
  fresh blocks for the run and everything after, the loader fills them (``seq.tier_load``)
  while the request waits, and ``finish_load`` (the scheduler, once done) inserts what was
  loaded into the tree, locks it and sets ``num_computed``. A record that fails its checks
  ends the run there: the rest is computed. ``release`` of a loading request cancels the
  load and waits for it first (the loader writes into its blocks).

Only the engine thread calls these.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgate.kv import PUBLIC_NAMESPACE, BlockPool, CacheEvent, Probe, RadixTree
from radixgate.kv.tiers.index import TierRun
from radixgate.kv.tiers.disk.glue import write_through

if TYPE_CHECKING:
    from radixgate.runtime.engine.sequence import Sequence


MEMORY_PIN_MAX_TTL_S = 3600.0   # with a lower tier, longer pins keep their blocks there
WRITE_THROUGH_TTL_S = 3600.0    # pins this long are written to the tier when set (crash-safe)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class SeqProbe:
    """A sequence's cached prefixes: in its own namespace and (when it opts in) ``public``."""

    seq: Sequence
    own: Probe
    public: Probe | None

    @property
    def best(self) -> Probe:
        """The longer of the two (own on a tie): the one ``match`` keeps."""
        public = self.public
        return public if public is not None and public.length > self.own.length else self.own


class KVManager:
    def __init__(self, tree: RadixTree, pool: BlockPool, kv, *, enable_prefix_cache: bool = True,
                 page_rounded: bool = False, tier=None):
        self.tree = tree
        self.tier = tier                          # a kv.tiers.disk.KVTier, or None
        self.hit_tokens = {"memory": 0, "disk": 0}   # prompt tokens reused, by tier
        self.pool = pool
        self.kv = kv
        self.block_size = pool.block_size
        self.enable_prefix_cache = enable_prefix_cache
        self.page_rounded = page_rounded
        self.probes: dict[int, SeqProbe] = {}     # id(seq) -> its probe (this step's)
        self.window = getattr(kv, "window", None)  # kv.WindowSlots, or None
        if self.window is not None:
            pool.on_free = self.window.on_main_free
            self.window.protected = self._pinned_window_blocks
            self.window.on_tombstone = self._announce_windowless

    # -- probing ------------------------------------------------------------------------
    def probe(self, seq: Sequence) -> SeqProbe:
        """seq's cached prefixes (reads only), walking the tree only when the kept probe is
        missing or the tree changed since (prefix cache on only)."""
        kept = self.probes.get(id(seq))
        if (kept is not None and kept.seq is seq and kept.own.version == self.tree.version
                and kept.own.num_tokens == len(seq.tokens)):
            return kept
        public = None
        if seq.request.use_public and seq.namespace != PUBLIC_NAMESPACE:
            public = self.tree.probe(PUBLIC_NAMESPACE, seq.tokens)
        kept = self.probes[id(seq)] = SeqProbe(seq, self.tree.probe(seq.namespace, seq.tokens),
                                               public)
        return kept

    def forget_probes(self) -> None:
        """A new scheduling pass: probes are kept for one pass only."""
        self.probes.clear()

    # -- matching -----------------------------------------------------------------------
    def match(self, seq: Sequence):
        """The longest cached prefix of seq.tokens (a MatchResult the caller must release),
        or None when the prefix cache is off or seq wants prompt logprobs (they need the
        logits of every prompt position, which cached K/V does not keep)."""
        if not self.enable_prefix_cache or seq.params.prompt_logprobs is not None:
            return None
        probe = self.probe(seq)
        found = self.tree.match(seq.namespace, seq.tokens, probe=probe.own)
        if probe.public is not None:
            try:
                public = self.tree.match(PUBLIC_NAMESPACE, seq.tokens, probe=probe.public)
            except BaseException:
                self.release_match(found)
                raise
            if public.length > found.length:
                found, public = public, found
            self.release_match(public)
        return found

    def peek_length(self, seq: Sequence) -> int:
        """Cached prefix length of seq.tokens without locking, counting hits or touching LRU
        (orders a tenant's queue longest-prefix-first)."""
        if not self.enable_prefix_cache or seq.params.prompt_logprobs is not None:
            return 0
        return self.probe(seq).best.length

    def may_fit(self, seq: Sequence, reuse: bool = True) -> bool:
        """Checked before matching (reads only): could ``admit`` find seq's blocks now, with
        its cached prefix (``reuse``) or computing everything? Counts the blocks admission
        allocates (a reuse ending inside a block needs a private copy of it) against free
        blocks plus what eviction can free once the match has locked the matched path (only
        the matched head of a node the match ends inside) and leaving pinned paths alone."""
        n = len(seq.tokens)
        best = self.probe(seq).best if reuse and self.enable_prefix_cache else None
        matched = best.length if best is not None else 0
        need = self.blocks_to_allocate(self.reuse_length(matched, n), n)
        free = self.pool.num_free()
        if need <= free:
            return True
        return self.enable_prefix_cache and need <= free + self.tree.freeable_blocks(best)

    def blocks_to_allocate(self, reuse: int, num_tokens: int) -> int:
        """Fresh blocks a sequence of ``num_tokens`` reusing ``reuse`` tokens takes: all but
        the reused blocks, a partly reused last block counting (its private copy)."""
        return _ceil_div(num_tokens, self.block_size) - reuse // self.block_size

    def release_match(self, found) -> None:
        if found is None:
            return
        self.pool.decref_many(found.blocks)
        self.tree.unlock(found.handle)

    def reuse_length(self, matched: int, num_tokens: int) -> int:
        reuse = min(matched, num_tokens - 1)
        if self.page_rounded:
            reuse -= reuse % self.block_size
        return max(reuse, 0)

    # -- admission ----------------------------------------------------------------------
    def admit(self, seq: Sequence, found) -> bool:
        """Give seq blocks for all its tokens, reusing the match. Consumes ``found``: on
        success its lock becomes seq.lock_handle; on failure (not enough blocks even after
        eviction; nothing is evicted then) or an exception it is released and seq is
        unchanged. Returns success."""
        run = self._tier_run(seq, found)
        if run is not None:
            return self._admit_loading(seq, found, run)
        B = self.block_size
        matched = found.length if found is not None else 0
        reuse = self.reuse_length(matched, len(seq.tokens))
        if self.window is not None and found is not None:
            reuse = self._usable_reuse(found.blocks, reuse)
        keep = _ceil_div(reuse, B)
        partial = reuse % B
        need = self.blocks_to_allocate(reuse, len(seq.tokens))
        table = list(found.blocks[:keep]) if found is not None else []
        if found is not None:
            self.pool.decref_many(found.blocks[keep:])
        held: list[int] = []
        try:
            if not self._room_for(need):
                self._give_back(table, found)
                return False
            held = self._hold_window(table, reuse, reuse)   # before any window eviction
            if not self._window_room(partial > 0):
                self._drop_window(held)
                self._give_back(table, found)
                return False
            if partial:
                table[-1] = self._copy_on_write(table[-1], partial)
                need -= 1
            table += self.pool.allocate(need)
        except BaseException:
            self._drop_window(held)
            self._give_back(table, found)
            raise
        seq.block_table = table
        seq.window_held = dict.fromkeys(range(keep - len(held), keep))
        seq.num_computed = reuse
        seq.lock_handle = found.handle if found is not None else None
        self.hit_tokens["memory"] += reuse
        return True

    # -- the window layers' pool (docs/ARCHITECTURE.md section 9b) ------------------------
    def _usable_reuse(self, blocks: list[int], reuse: int) -> int:
        """``reuse`` backed off to where the window layers hold what it needs (page-rounded
        again when the cache matches whole blocks only)."""
        while True:
            usable = self.window.usable_reuse(blocks, reuse)
            if self.page_rounded:
                usable -= usable % self.block_size
            if usable == reuse:
                return reuse
            reuse = usable

    def _window_room(self, fresh: int) -> bool:
        return self.window is None or self.window.make_room(int(fresh))

    def _hold_window(self, table: list[int], first: int, end: int) -> list[int]:
        """Hold the window data queries at ``first .. end - 1`` read from ``table`` (blocks
        that have it: a reuse checked by ``_usable_reuse``); returns the blocks held."""
        if self.window is None:
            return []
        held = self.window.needed(table, first, end)
        self.window.hold(held)
        self.window.touch(held)
        return held

    def _drop_window(self, blocks: list[int]) -> None:
        if self.window is not None and blocks:
            self.window.drop(blocks)

    def reserve_window(self, seq: Sequence, end: int) -> bool:
        """Before a step computes seq's positions up to ``end``: give up the window data its
        window has passed and hold the blocks the step reads and writes (fresh window ids
        for new blocks, tombstoning the tree's least useful window data when short). False
        when the window pool cannot make room (nothing changes then)."""
        window, B = self.window, self.block_size
        if window is None:
            return True
        held, table = seq.window_held, seq.block_table
        lo = max(0, seq.num_computed - window.window + 1) // B
        passed = [i for i in held if i < lo]
        if passed:
            window.drop([table[i] for i in passed])
            for i in passed:
                del held[i]
        wanted = [i for i in range(lo, _ceil_div(end, B)) if i not in held]
        if not wanted:
            return True
        blocks = [table[i] for i in wanted]
        present = [b for b in blocks if window.has(b)]
        window.hold(present)                  # first: eviction must not take them
        fresh = [b for b in blocks if b not in set(present)]
        if not window.make_room(len(fresh)):
            window.drop(present)
            return False
        window.hold(fresh)
        held.update(dict.fromkeys(wanted))
        return True

    def _keep_window(self, seq: Sequence, n: int, result) -> None:
        """The tree now caches seq's first ``n`` tokens (``result``: the insert's): it keeps
        the window data of the blocks it holds for them that seq holds (the rest has none,
        or is kept already); new cached blocks without any are announced so."""
        if self.window is None or n == 0:
            return
        node = result.handle.node if result.handle is not None else \
            self.tree.probe(seq.namespace, seq.tokens[:n]).node
        if node is None:
            return
        blocks = node.path_blocks(self.block_size)[:_ceil_div(n, self.block_size)]
        self.window.keep(blocks[i] for i in seq.window_held if i < len(blocks))
        fresh = blocks[result.cached_before // self.block_size:]
        self._announce_windowless([b for b in fresh if not self.window.has(b)])

    def _announce_windowless(self, blocks: list[int]) -> None:
        """Cached blocks without window data, told to the tree's event sink (KV events)."""
        if self.tree.on_event is not None and blocks:
            self.tree.on_event(CacheEvent("window_removed", "", tuple(blocks), 0, 0, "window"))

    def _release_window(self, seq: Sequence) -> None:
        held, seq.window_held = seq.window_held, {}
        self._drop_window([seq.block_table[i] for i in held])

    def _pinned_window_blocks(self) -> set[int]:
        """Blocks whose window data a pinned prefix's end reads (window eviction leaves
        them: a pinned prefix stays usable)."""
        protected: set[int] = set()
        for node in self.tree.pinned_nodes:
            blocks = node.path_blocks(self.block_size)
            protected.update(self.window.needed(blocks, node.end, node.end))
        return protected

    # -- the lower tier -----------------------------------------------------------------
    def _tier_run(self, seq: Sequence, found) -> TierRun | None:
        """The tier's stored run past ``found`` when loading it saves at least one block
        of prefill (None without a tier, a match or such a run)."""
        tier = self.tier
        if tier is None or found is None or not tier.holds_namespace(seq.namespace):
            return None
        n, B = len(seq.tokens), self.block_size
        if seq.tier_chain is None or seq.tier_chain[0] != n:
            seq.tier_chain = (n, tier.chain(seq.namespace, seq.tokens))
        run = tier.find(seq.namespace, seq.tokens, found.length // B, seq.tier_chain[1])
        if run is None or min(run.length, n - 1) - min(found.length, n - 1) < B:
            return None
        if self.window is not None and not self._window_loadable(found, run, n):
            return None
        return run

    def _window_loadable(self, found, run: TierRun, n: int) -> bool:
        """With a window pool, a load needs the memory part's end usable (the fallback when
        loaded records lack window data) and room for the loaded blocks' window data."""
        start = run.first_index * self.block_size
        end = min(run.length, n - 1)
        fresh = _ceil_div(end, self.block_size) - max(
            run.first_index, max(0, end - self.window.window + 1) // self.block_size)
        # room first: its evictions may tombstone what the check below needs
        return (self.window.make_room(fresh)
                and self.window.usable_reuse(found.blocks, start) == start)

    def _admit_loading(self, seq: Sequence, found, run: TierRun) -> bool:
        """``admit`` with ``run`` loaded from the tier: the match's whole blocks before the
        run are kept, fresh blocks cover the rest; the load is queued (``seq.tier_load``)."""
        first = run.first_index
        need = _ceil_div(len(seq.tokens), self.block_size) - first
        self.tier.touch_run(run)                  # before the evictions that make room
        table = list(found.blocks[:first])
        self.pool.decref_many(found.blocks[first:])
        held: list[int] = []
        try:
            if not self._room_for(need):
                self._give_back(table, found)
                return False
            table += self.pool.allocate(need)
            held = self._hold_loading_window(seq, table, first, run)
            seq.tier_load = self.tier.load(run, table[first:first + len(run.records)])
        except BaseException:
            self._drop_window([table[i] for i in held])
            seq.window_held = {}
            self._give_back(table, found)
            raise
        seq.block_table = table
        seq.num_computed = first * self.block_size
        seq.lock_handle = found.handle
        return True

    def _hold_loading_window(self, seq: Sequence, table: list[int], first: int,
                             run: TierRun) -> list[int]:
        """Window data for a load (``_window_loadable`` made the room): what the memory part's
        end reads, and the blocks the run's end reads (fresh ids the loader fills). Returns
        the table indices held (``seq.window_held``)."""
        if self.window is None:
            return []
        B, W = self.block_size, self.window.window
        end = min(run.length, len(seq.tokens) - 1)
        indices = dict.fromkeys(range(max(0, first * B - W + 1) // B, first))
        indices.update(dict.fromkeys(i for i in range(max(0, end - W + 1) // B, _ceil_div(end, B))
                                     if i >= first or self.window.has(table[i])))
        held = list(indices)
        self.window.hold([table[i] for i in held])
        seq.window_held = dict.fromkeys(held)
        return held

    def _settle_loaded_window(self, seq: Sequence, ticket, reuse: int) -> int:
        """After a load: window data the records lacked, or that did not load, is let go
        (tombstones), and the reuse backs off to where the window layers hold what it needs,
        never below the memory part (usable by ``_window_loadable``)."""
        first = ticket.run.first_index
        gone = [first + i for i in ticket.unwindowed] + [
            i for i in seq.window_held if i >= first + ticket.loaded]
        for i in dict.fromkeys(gone):
            if i in seq.window_held:
                del seq.window_held[i]
                self.window.drop([seq.block_table[i]])
        return max(self._usable_reuse(seq.block_table, reuse), first * self.block_size)

    def finish_load(self, seq: Sequence) -> bool:
        """False while seq's load runs; once done: what loaded is seq's reuse (inserted and
        locked in the tree), and True."""
        ticket = seq.tier_load
        if ticket is None:
            return True
        if not ticket.done.is_set():
            return False
        seq.tier_load = None
        memory_part = seq.num_computed
        reuse = min(ticket.length, len(seq.tokens) - 1)
        if self.window is not None:
            reuse = self._settle_loaded_window(seq, ticket, reuse)
        self.hit_tokens["memory"] += memory_part
        if reuse > memory_part:
            seq.num_computed = reuse
            seq.disk_read = reuse - memory_part
            self.hit_tokens["disk"] += reuse - memory_part
            self.tier.count_hit(reuse - memory_part)
            result = self.tree.insert(seq.namespace, seq.tokens[:reuse],
                                      seq.block_table[:_ceil_div(reuse, self.block_size)],
                                      lock=True)
            self._keep_window(seq, reuse, result)
            old, seq.lock_handle = seq.lock_handle, result.handle
            if old is not None:
                self.tree.unlock(old)
        return True

    def _abandon_load(self, seq: Sequence) -> None:
        """seq ends or is preempted while loading: stop the load and wait until the loader
        leaves its blocks (seq keeps its memory part only)."""
        ticket, seq.tier_load = seq.tier_load, None
        if ticket is not None:
            ticket.cancel()
            ticket.wait()

    def _give_back(self, table: list[int], found) -> None:
        """Drop the references in ``table`` and the lock of ``found`` (a failed admission)."""
        self.pool.decref_many(table)
        if found is not None:
            self.tree.unlock(found.handle)

    def _room_for(self, num_blocks: int) -> bool:
        """Make num_blocks free, evicting only when eviction can free enough."""
        free = self.pool.num_free()
        if num_blocks <= free:
            return True
        if not self.enable_prefix_cache or num_blocks > free + self.tree.freeable_blocks():
            return False
        return self.make_room(num_blocks)

    def _copy_on_write(self, shared: int, valid_slots: int) -> int:
        """A private copy of the first ``valid_slots`` slots of a shared block (all layers;
        the window layers' too, the copy holding a fresh window id in place of the shared
        block's); the reference to ``shared`` is dropped once the copy is made (kept if it
        fails)."""
        private = self.pool.allocate(1)[0]
        windowed = self.window is not None and self.window.has(shared)
        try:
            if windowed:
                self.window.hold([private])
            self.kv.copy_blocks(torch.tensor([[shared, private]], dtype=torch.int64),
                                torch.tensor([valid_slots], dtype=torch.int32))
        except BaseException:
            if windowed and self.window.has(private):
                self.window.drop([private])
            self.pool.decref(private)
            raise
        if windowed:
            self.window.drop([shared])
        self.pool.decref(shared)
        return private

    def make_room(self, num_blocks: int) -> bool:
        """Evict unlocked cache until num_blocks are free; True when they are."""
        short = num_blocks - self.pool.num_free()
        if short > 0 and self.enable_prefix_cache:
            self.tree.evict(short)
        return self.pool.can_allocate(num_blocks)

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Add blocks so positions [0, num_tokens) have one (evicting if needed)."""
        need = seq.blocks_needed(num_tokens, self.block_size)
        if need == 0:
            return True
        if not self.make_room(need):
            return False
        seq.block_table += self.pool.allocate(need)
        return True

    def grow_from_free(self, seq: Sequence, num_tokens: int, keep_free: int = 0) -> bool:
        """Add blocks so positions [0, num_tokens) have one, only from free blocks and only
        while ``keep_free`` stay free afterwards (speculative drafts: never an eviction, so
        never a preemption)."""
        need = seq.blocks_needed(num_tokens, self.block_size)
        if need == 0:
            return True
        if need + keep_free > self.pool.num_free():
            return False
        seq.block_table += self.pool.allocate(need)
        return True

    # -- tree updates -------------------------------------------------------------------
    def insert_prefilled(self, seq: Sequence) -> None:
        """Insert tokens[:num_computed] and move seq's lock to the node ending there."""
        if not self.enable_prefix_cache:
            return
        n = self.cacheable(seq.num_computed)
        if n == 0:
            return
        result = self.tree.insert(seq.namespace, seq.tokens[:n],
                                  seq.block_table[:_ceil_div(n, self.block_size)], lock=True)
        self._keep_window(seq, n, result)
        old, seq.lock_handle = seq.lock_handle, result.handle
        if old is not None:
            self.tree.unlock(old)

    def release(self, seq: Sequence, cache: bool = True) -> None:
        """Return seq's blocks: insert its computed tokens (when ``cache``), unlock, decref."""
        self._abandon_load(seq)
        n = self.cacheable(seq.num_computed)
        if cache and self.enable_prefix_cache and n > 0:
            result = self.tree.insert(seq.namespace, seq.tokens[:n],
                                      seq.block_table[:_ceil_div(n, self.block_size)])
            self._keep_window(seq, n, result)
        self._release_window(seq)
        if seq.lock_handle is not None:
            self.tree.unlock(seq.lock_handle)
        self.pool.decref_many(seq.block_table)
        seq.block_table = []
        seq.lock_handle = None
        seq.num_computed = 0
        seq.prefill_inserted = False

    def cacheable(self, num_computed: int) -> int:
        """How many computed tokens go into the tree: all of them, or whole blocks only when
        ``page_rounded`` (a hash-block cache keeps no partial block)."""
        if self.page_rounded:
            return num_computed - num_computed % self.block_size
        return num_computed

    def pin(self, seq: Sequence, offset: int, ttl_s: float) -> int:
        """Pin seq's first ``offset`` tokens for ``ttl_s`` (``pin_prefix``)."""
        return self.pin_prefix(seq.namespace, seq.tokens[:offset], ttl_s, seq.tenant)

    def pin_prefix(self, namespace: str, tokens, ttl_s: float, owner: str = "") -> int:
        """Pin the cached prefix of ``tokens`` for ``ttl_s`` (``RadixTree.pin``). With a
        lower tier their blocks are retained there for ``ttl_s`` and memory keeps them at
        most ``MEMORY_PIN_MAX_TTL_S`` (a 24 h retention does not hold memory for a day);
        a pin of ``WRITE_THROUGH_TTL_S`` or more is staged for the tier at once, so a
        ``kill -9`` does not lose it."""
        if self.tier is None:
            return self.tree.pin(namespace, tokens, ttl_s, owner=owner)
        self.tier.retain(namespace, tokens, ttl_s)
        pinned = self.tree.pin(namespace, tokens, min(ttl_s, MEMORY_PIN_MAX_TTL_S), owner=owner)
        if pinned and ttl_s >= WRITE_THROUGH_TTL_S:
            write_through(self.tier, self.tree, namespace, tokens)
        return pinned

    def unpin_prefix(self, namespace: str, tokens) -> bool:
        """Remove the deepest pin on the cached path of ``tokens`` (and the tier's
        retention of ``tokens``' blocks)."""
        if self.tier is not None:
            self.tier.release(namespace, tokens)
        return self.tree.unpin(namespace, tokens)
