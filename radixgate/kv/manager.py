"""KVManager: a sequence's KV blocks against the radix tree, its attention groups and the
lower tier: admission, copy-on-write, growth, insert, release, pins.

Implements docs/ARCHITECTURE.md sections 2-3 for one sequence at a time (the scheduler decides when):

- ``admit``: match (own namespace, and ``public`` when the request opts in: the longer match
  wins, the other is released), reuse ``min(matched, len - 1)`` tokens (backed off to what
  every attention group can serve), drop references beyond the reuse, copy a partially
  reused last block into a private block (copy-on-write), allocate the rest (evicting
  unlocked cache when short, and only when that makes room). On failure or an exception
  everything taken is given back: the match's references and lock, the private copy, the
  groups' holds.
- ``may_fit``: the same count before matching, exact (``RadixTree.freeable_blocks``): free
  blocks plus what eviction can free against the blocks admission would allocate.
- ``probe``: one read-only walk per namespace searched (``RadixTree.probe``), kept for the
  scheduling pass and reused by ``peek_length``, ``may_fit`` and ``match`` while the tree's
  ``version`` is unchanged (``forget_probes`` at every step).
- ``insert_prefilled``: the computed tokens go into the tree and the request's lock moves to
  the node ending at them.
- ``release``: insert what was computed (``tokens[:num_computed]``, i.e. prompt +
  output[:-1] after decoding), unlock, drop the request's references and holds.
- Attention groups (kv/groups/base.py): the full-attention group always (it holds nothing),
  the window group when ``kv.window`` is a window pool; only groups that hold anything
  (``holding``) are asked on each path.
- With a lower tier (``tier``, kv/tiers/base.py): ``admit`` asks it for the stored run
  extending the memory match; when that saves at least a block of prefill, the request gets
  fresh blocks for the run and everything after, the loader fills them (``seq.kv.tier_load``)
  while the request waits, and ``finish_load`` (the scheduler, once done) inserts what was
  loaded into the tree, locks it and sets ``num_computed``. A record that fails its checks
  ends the run there: the rest is computed. ``release`` of a loading request cancels the
  load and waits for it first (the loader writes into its blocks).

The page-rounded baseline (whole blocks only, a hash-block cache) is a subclass:
kv/page_rounded.py. Only the engine thread calls these.
"""
from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from radixgate.kv import PUBLIC_NAMESPACE, BlockPool, Probe, RadixTree
from radixgate.kv.groups.base import AttentionGroup
from radixgate.kv.groups.full import FullAttentionGroup
from radixgate.kv.groups.window import WindowGroup, window_pool_counts
from radixgate.kv.tiers.base import LowerTier, close_tier, write_through
from radixgate.kv.tiers.index import TierRun

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
    """The only KV object the scheduler and the engine core see.

    ``tree`` and ``pool``: the radix tree over the main pool; ``kv``: the KV tensors (their
    ``copy_blocks`` serves copy-on-write; ``kv.window``, a ``WindowSlots`` or None, adds the
    window group: the pool must then be built with ``on_free=kv.window.on_main_free``);
    ``tier``: a ``LowerTier`` or None; ``groups``: the attention groups (default: from ``kv``).
    """

    def __init__(self, tree: RadixTree, pool: BlockPool, kv, *, enable_prefix_cache: bool = True,
                 tier: LowerTier | None = None, groups: Seq[AttentionGroup] | None = None):
        self.tree = tree
        self.tier = tier
        self.hit_tokens = {"memory": 0, "disk": 0}   # prompt tokens reused, by tier
        self.pool = pool
        self.kv = kv
        self.block_size = pool.block_size
        self.enable_prefix_cache = enable_prefix_cache
        self.probes: dict[int, SeqProbe] = {}     # id(seq) -> its probe (this step's)
        self.groups = tuple(groups) if groups is not None else self._default_groups()
        self.holding = tuple(g for g in self.groups if g.holds)
        self.holds_per_step = bool(self.holding)  # ``reserve`` before every step

    def _default_groups(self) -> tuple[AttentionGroup, ...]:
        window = getattr(self.kv, "window", None)
        if window is None:
            return (FullAttentionGroup(),)
        if self.pool.on_free != window.on_main_free:
            raise ValueError("a window pool needs the main pool built with "
                             "on_free=window.on_main_free")
        return FullAttentionGroup(), WindowGroup(window, self.tree)

    # -- probing ------------------------------------------------------------------------
    def probe(self, seq: Sequence) -> SeqProbe:
        """seq's cached prefixes (reads only, no lock), walking the tree only when the kept
        probe is missing or the tree changed since. Valid for this scheduling pass."""
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
        """The longest cached prefix of seq.tokens, or None when the prefix cache is off or
        seq wants prompt logprobs (they need the logits of every prompt position, which
        cached K/V does not keep). The result holds one pool reference per block and a tree
        lock on its path: hand it to ``admit`` (which consumes it) or ``release_match``."""
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
        """Give back a ``match`` result ``admit`` did not consume (references and lock)."""
        if found is None:
            return
        self.pool.decref_many(found.blocks)
        self.tree.unlock(found.handle)

    def reuse_length(self, matched: int, num_tokens: int) -> int:
        """Tokens of a ``matched`` prefix a sequence of ``num_tokens`` reuses: all but the
        last token (whose logits pick the next one)."""
        return max(min(matched, num_tokens - 1), 0)

    def round_reuse(self, reuse: int) -> int:
        """A reuse as this cache can serve it (every token here; whole blocks in the
        page-rounded baseline)."""
        return reuse

    def _usable_reuse(self, blocks: list[int], reuse: int) -> int:
        """``reuse`` backed off until every holding group serves it (and ``round_reuse``)."""
        while True:
            usable = reuse
            for group in self.holding:
                usable = group.usable_reuse(blocks, usable)
            usable = self.round_reuse(usable)
            if usable == reuse:
                return reuse
            reuse = usable

    # -- admission ----------------------------------------------------------------------
    def admit(self, seq: Sequence, found) -> bool:
        """Give seq blocks for all its tokens, reusing the match. Consumes ``found``: on
        success its lock becomes ``seq.kv.lock_handle`` (held until ``release``), seq holds one
        pool reference per ``block_table`` entry and its groups' holds; on failure (not
        enough blocks even after eviction; nothing is evicted then) or an exception it is
        released and seq is unchanged. With a lower tier's run worth loading, seq gets its
        blocks and a queued load (``seq.kv.tier_load``, see ``finish_load``). Returns success."""
        run = self._tier_run(seq, found)
        if run is not None:
            return self._admit_loading(seq, found, run)
        B = self.block_size
        matched = found.length if found is not None else 0
        reuse = self.reuse_length(matched, len(seq.tokens))
        if self.holding and found is not None:
            reuse = self._usable_reuse(found.blocks, reuse)
        keep = _ceil_div(reuse, B)
        partial = reuse % B
        need = self.blocks_to_allocate(reuse, len(seq.tokens))
        table = list(found.blocks[:keep]) if found is not None else []
        if found is not None:
            self.pool.decref_many(found.blocks[keep:])
        try:
            if not self._room_for(need) or not self._hold_reused(seq, table, reuse, partial > 0):
                self._give_back(table, found)
                return False
            if partial:
                table[-1] = self._copy_on_write(table[-1], partial)
                need -= 1
            table += self.pool.allocate(need)
        except BaseException:
            self._release_groups(seq, table)
            self._give_back(table, found)
            raise
        seq.kv.block_table = table
        seq.num_computed = reuse
        seq.kv.lock_handle = found.handle if found is not None else None
        self.hit_tokens["memory"] += reuse
        return True

    def _hold_reused(self, seq: Sequence, table: list[int], reuse: int, copy: bool) -> bool:
        """Each holding group holds what the reuse needs (all or none)."""
        for i, group in enumerate(self.holding):
            if not group.hold_reused(seq.kv, table, reuse, int(copy)):
                for taken in self.holding[:i]:
                    taken.release(seq.kv, table)
                return False
        return True

    def _release_groups(self, seq: Sequence, table: list[int]) -> None:
        for group in self.holding:
            group.release(seq.kv, table)

    def reserve(self, seq: Sequence, end: int) -> bool:
        """Before a step computes seq's positions up to ``end`` (only when
        ``holds_per_step``): each holding group lets go of what seq no longer needs and
        holds what the step reads and writes (held until the next ``reserve`` or
        ``release``). False when a group cannot make room (nothing changes then)."""
        for group in self.holding:
            if not group.reserve(seq.kv, seq.num_computed, end):
                return False
        return True

    # -- the lower tier -----------------------------------------------------------------
    def _tier_run(self, seq: Sequence, found) -> TierRun | None:
        """The tier's stored run past ``found`` when loading it saves at least one block
        of prefill (None without a tier, a match or such a run)."""
        tier = self.tier
        if tier is None or found is None or not tier.holds_namespace(seq.namespace):
            return None
        n, B = len(seq.tokens), self.block_size
        if seq.kv.tier_chain is None or seq.kv.tier_chain[0] != n:
            seq.kv.tier_chain = (n, tier.chain(seq.namespace, seq.tokens))
        run = tier.find(seq.namespace, seq.tokens, found.length // B, seq.kv.tier_chain[1])
        if run is None or min(run.length, n - 1) - min(found.length, n - 1) < B:
            return None
        if not all(group.loadable(found.blocks, run, n) for group in self.holding):
            return None
        return run

    def _admit_loading(self, seq: Sequence, found, run: TierRun) -> bool:
        """``admit`` with ``run`` loaded from the tier: the match's whole blocks before the
        run are kept, fresh blocks cover the rest; the load is queued (``seq.kv.tier_load``)."""
        first = run.first_index
        need = _ceil_div(len(seq.tokens), self.block_size) - first
        self.tier.touch_run(run)                  # before the evictions that make room
        table = list(found.blocks[:first])
        self.pool.decref_many(found.blocks[first:])
        try:
            if not self._room_for(need):
                self._give_back(table, found)
                return False
            table += self.pool.allocate(need)
            for group in self.holding:
                group.hold_loading(seq.kv, table, first, run, len(seq.tokens))
            seq.kv.tier_load = self.tier.load(run, table[first:first + len(run.records)])
        except BaseException:
            self._release_groups(seq, table)
            self._give_back(table, found)
            raise
        seq.kv.block_table = table
        seq.num_computed = first * self.block_size
        seq.kv.lock_handle = found.handle
        return True

    def finish_load(self, seq: Sequence) -> bool:
        """False while seq's load runs; once done: what loaded is seq's reuse (inserted and
        locked in the tree, the lock moving to ``seq.kv.lock_handle``), and True."""
        ticket = seq.kv.tier_load
        if ticket is None:
            return True
        if not ticket.done.is_set():
            return False
        seq.kv.tier_load = None
        memory_part = seq.num_computed
        reuse = min(ticket.length, len(seq.tokens) - 1)
        if self.holding:
            for group in self.holding:
                group.settle_load(seq.kv, ticket)
            # never below the memory part (usable: the groups' ``loadable``)
            reuse = max(self._usable_reuse(seq.kv.block_table, reuse),
                        ticket.run.first_index * self.block_size)
        self.hit_tokens["memory"] += memory_part
        if reuse > memory_part:
            seq.num_computed = reuse
            seq.kv.disk_read = reuse - memory_part
            self.hit_tokens["disk"] += reuse - memory_part
            self.tier.count_hit(reuse - memory_part)
            self._insert_locked(seq, reuse)
        return True

    def _abandon_load(self, seq: Sequence) -> None:
        """seq ends or is preempted while loading: stop the load and wait until the loader
        leaves its blocks (seq keeps its memory part only)."""
        ticket, seq.kv.tier_load = seq.kv.tier_load, None
        if ticket is not None:
            ticket.cancel()
            ticket.wait()

    def close(self) -> None:
        """The engine stopped: the lower tier keeps what the tree holds, then closes (its
        ``spill`` stages nothing afterwards); the manager has no tier from then on."""
        tier, self.tier = self.tier, None
        if tier is not None:
            close_tier(tier, self.tree)

    # -- blocks -------------------------------------------------------------------------
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
        each group settles its part, e.g. the window layers' fresh id); the reference to
        ``shared`` is dropped once the copy is made (kept if it fails)."""
        private = self.pool.allocate(1)[0]
        began: list[bool] = []
        try:
            for group in self.holding:
                began.append(group.begin_copy(shared, private))
            self.kv.copy_blocks(torch.tensor([[shared, private]], dtype=torch.int64),
                                torch.tensor([valid_slots], dtype=torch.int32))
        except BaseException:
            for group, took in zip(self.holding, began):
                group.end_copy(shared, private, took, copied=False)
            self.pool.decref(private)
            raise
        for group, took in zip(self.holding, began):
            group.end_copy(shared, private, took, copied=True)
        self.pool.decref(shared)
        return private

    def make_room(self, num_blocks: int) -> bool:
        """Evict unlocked cache until num_blocks are free; True when they are."""
        short = num_blocks - self.pool.num_free()
        if short > 0 and self.enable_prefix_cache:
            self.tree.evict(short)
        return self.pool.can_allocate(num_blocks)

    def grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Add blocks so positions [0, num_tokens) have one (evicting if needed); seq holds
        them until ``release``. False (nothing changes) when they cannot be found."""
        need = seq.kv.blocks_needed(num_tokens, self.block_size)
        if need == 0:
            return True
        if not self.make_room(need):
            return False
        seq.kv.block_table += self.pool.allocate(need)
        return True

    def grow_from_free(self, seq: Sequence, num_tokens: int, keep_free: int = 0) -> bool:
        """Add blocks so positions [0, num_tokens) have one, only from free blocks and only
        while ``keep_free`` stay free afterwards (speculative drafts: never an eviction, so
        never a preemption)."""
        need = seq.kv.blocks_needed(num_tokens, self.block_size)
        if need == 0:
            return True
        if need + keep_free > self.pool.num_free():
            return False
        seq.kv.block_table += self.pool.allocate(need)
        return True

    # -- tree updates -------------------------------------------------------------------
    def insert_prefilled(self, seq: Sequence) -> None:
        """Insert tokens[:num_computed] (``cacheable``) and move seq's lock to the node
        ending there (the old lock is released once the new one is held)."""
        if not self.enable_prefix_cache:
            return
        n = self.cacheable(seq.num_computed)
        if n:
            self._insert_locked(seq, n)

    def _insert_locked(self, seq: Sequence, n: int) -> None:
        result = self.tree.insert(seq.namespace, seq.tokens[:n],
                                  seq.kv.block_table[:_ceil_div(n, self.block_size)], lock=True)
        self._keep(seq, n, result)
        old, seq.kv.lock_handle = seq.kv.lock_handle, result.handle
        if old is not None:
            self.tree.unlock(old)

    def _keep(self, seq: Sequence, n: int, result) -> None:
        for group in self.holding:
            group.keep(seq.kv, seq.namespace, seq.tokens, n, result)

    def release(self, seq: Sequence, cache: bool = True) -> None:
        """Return seq's blocks: cancel a load (waiting for its loader), insert its computed
        tokens (when ``cache``), drop the groups' holds, unlock, decref. seq holds nothing
        afterwards (it may be admitted again)."""
        self._abandon_load(seq)
        n = self.cacheable(seq.num_computed)
        if cache and self.enable_prefix_cache and n > 0:
            result = self.tree.insert(seq.namespace, seq.tokens[:n],
                                      seq.kv.block_table[:_ceil_div(n, self.block_size)])
            self._keep(seq, n, result)
        self._release_groups(seq, seq.kv.block_table)
        if seq.kv.lock_handle is not None:
            self.tree.unlock(seq.kv.lock_handle)
        self.pool.decref_many(seq.kv.block_table)
        seq.kv.block_table = []
        seq.kv.lock_handle = None
        seq.num_computed = 0
        seq.kv.prefill_inserted = False

    def cacheable(self, num_computed: int) -> int:
        """How many computed tokens go into the tree: all of them here."""
        return num_computed

    # -- books --------------------------------------------------------------------------
    def check_integrity(self, running: Seq[Sequence], sequences: Seq[Sequence] = ()) -> dict:
        """Recount tree and pool with ``running``'s block tables as extra holders (raises
        ``IntegrityError``); free + held == total; with nothing running nothing may be
        locked; with a window pool its ids are recounted against ``sequences``' holds.
        Returns the counts (free, held, total, locks, running; window)."""
        tables = [seq.kv.block_table for seq in running]
        self.tree.check_integrity(extra_holders=tables)
        kept = self.tree.held_blocks()
        held = kept.union(*map(set, tables)) if tables else kept
        free = self.pool.num_free()
        if free + len(held) != self.pool.num_blocks:
            raise AssertionError(f"free {free} + held {len(held)} != total {self.pool.num_blocks}")
        if not running and self.tree.handles:
            raise AssertionError(f"idle engine left {len(self.tree.handles)} locks in the tree")
        report = {"free": free, "held": len(held), "total": self.pool.num_blocks,
                  "locks": len(self.tree.handles), "running": len(running)}
        window = getattr(self.kv, "window", None)
        if window is not None:
            window.check(kept, [seq.kv.window_ids(seq.kv.block_table) for seq in sequences])
            report["window"] = window.stats()
        return report

    def window_counts(self, running: Seq[Sequence]):
        """The window layers' pool at a moment (``kv/groups/window.py``), or None."""
        window = getattr(self.kv, "window", None)
        return None if window is None else window_pool_counts(self.kv, running)

    # -- pins ---------------------------------------------------------------------------
    def pin(self, seq: Sequence, offset: int, ttl_s: float) -> int:
        """Pin seq's first ``offset`` tokens for ``ttl_s`` (``pin_prefix``)."""
        return self.pin_prefix(seq.namespace, seq.tokens[:offset], ttl_s, seq.tenant)

    def pin_prefix(self, namespace: str, tokens, ttl_s: float, owner: str = "") -> int:
        """Pin the cached prefix of ``tokens`` for ``ttl_s`` (``RadixTree.pin``: eviction
        leaves it until it expires or ``unpin_prefix``). With a lower tier their blocks are
        retained there for ``ttl_s`` and memory keeps them at most ``MEMORY_PIN_MAX_TTL_S``
        (a 24 h retention does not hold memory for a day); a pin of ``WRITE_THROUGH_TTL_S``
        or more is staged for the tier at once, so a ``kill -9`` does not lose it."""
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
