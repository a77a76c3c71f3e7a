"""The sliding-window group: the window layers' K/V in their own pool (``WindowSlots``,
docs/ARCHITECTURE.md section 9b), held by running sequences and kept by the tree.

A running sequence holds the window data of the blocks its last W positions and its next
step read (``state.window_held``: their table indices); the tree keeps one reference per
cached block that still has window data, given up under pressure (tombstones, told to the
event sink as ``window_removed``), never the blocks a pinned prefix's end reads.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from ..core.events import CacheEvent
from ..core.tree import RadixTree
from .window_slots import WindowSlots


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class WindowGroup:
    """The ``AttentionGroup`` (groups/base.py) of the window layers over ``slots``; ``tree``
    answers which prefixes are pinned and where an insert ended; ``emit`` (default: the
    tree's event sink) receives a ``CacheEvent`` for cached blocks whose window data is let
    go (KV events), in step with the tree's own events."""

    holds = True

    def __init__(self, slots: WindowSlots, tree: RadixTree,
                 emit: Callable[[CacheEvent], None] | None = None):
        self.slots = slots
        self.tree = tree
        self.emit = emit
        self.block_size = slots.block_size
        self.window = slots.window

    # -- room in the window pool ----------------------------------------------------------
    def make_room(self, num_ids: int) -> bool:
        """``num_ids`` free window ids, tombstoning the tree's least useful window data
        (never a pinned prefix's end) when short; True when they are free."""
        slots = self.slots
        if slots.pool.num_free() < num_ids:
            self.announce(slots.evict(num_ids, self.pinned_blocks()))
        return slots.pool.num_free() >= num_ids

    def pinned_blocks(self) -> set[int]:
        """Blocks whose window data a pinned prefix's end reads (a pinned prefix stays usable)."""
        protected: set[int] = set()
        for node in self.tree.pinned_nodes:
            blocks = node.path_blocks(self.block_size)
            protected.update(self.slots.needed(blocks, node.end, node.end))
        return protected

    def announce(self, blocks: list[int]) -> None:
        """Cached blocks without window data, told to the event sink."""
        sink = self.emit if self.emit is not None else self.tree.on_event
        if blocks and sink:
            sink(CacheEvent("window_removed", "", tuple(blocks), 0, 0, "window"))

    # -- what a match may reuse -----------------------------------------------------------
    def usable_reuse(self, blocks: Sequence[int], reuse: int) -> int:
        return self.slots.usable_reuse(blocks, reuse)

    def loadable(self, found_blocks: Sequence[int], run, num_tokens: int) -> bool:
        """A load needs the memory part's end usable (the fallback when loaded records lack
        window data) and room for the loaded blocks' window data."""
        B = self.block_size
        start = run.first_index * B
        end = min(run.length, num_tokens - 1)
        fresh = _ceil_div(end, B) - max(run.first_index, max(0, end - self.window + 1) // B)
        # room first: its evictions may tombstone what the check below needs
        return self.make_room(fresh) and self.slots.usable_reuse(found_blocks, start) == start

    # -- what a step must hold ------------------------------------------------------------
    def hold_reused(self, state, table: list[int], reuse: int, copies: int) -> bool:
        """Hold the window data queries from ``reuse`` on read of ``table`` (a reuse checked
        by ``usable_reuse``), before any window eviction; then room for ``copies``."""
        slots = self.slots
        held = slots.needed(table, reuse, reuse)
        slots.hold(held)
        slots.touch(held)
        try:
            room = self.make_room(copies)
        except BaseException:
            slots.drop(held)
            raise
        if not room:
            slots.drop(held)
            return False
        keep = _ceil_div(reuse, self.block_size)
        state.window_held = dict.fromkeys(range(keep - len(held), keep))
        return True

    def begin_copy(self, shared: int, private: int) -> bool:
        """The private copy holds a fresh window id in place of the shared block's."""
        if not self.slots.has(shared):
            return False
        self.slots.hold([private])
        return True

    def end_copy(self, shared: int, private: int, began: bool, copied: bool) -> None:
        if not began:
            return
        if copied:
            self.slots.drop([shared])
        elif self.slots.has(private):
            self.slots.drop([private])

    def reserve(self, state, num_computed: int, end: int) -> bool:
        """Give up the window data the window has passed and hold the blocks the step reads
        and writes (fresh window ids for new blocks, tombstoning when short)."""
        slots, B = self.slots, self.block_size
        held, table = state.window_held, state.block_table
        lo = max(0, num_computed - self.window + 1) // B
        passed = [i for i in held if i < lo]
        if passed:
            slots.drop([table[i] for i in passed])
            for i in passed:
                del held[i]
        wanted = [i for i in range(lo, _ceil_div(end, B)) if i not in held]
        if not wanted:
            return True
        blocks = [table[i] for i in wanted]
        present = [b for b in blocks if slots.has(b)]
        slots.hold(present)                  # first: eviction must not take them
        fresh = [b for b in blocks if b not in set(present)]
        if not self.make_room(len(fresh)):
            slots.drop(present)
            return False
        slots.hold(fresh)
        held.update(dict.fromkeys(wanted))
        return True

    def hold_loading(self, state, table: list[int], first: int, run, num_tokens: int) -> None:
        """What the memory part's end reads, and the blocks the run's end reads (fresh ids
        the loader fills); ``loadable`` made the room."""
        B, W, slots = self.block_size, self.window, self.slots
        end = min(run.length, num_tokens - 1)
        indices = dict.fromkeys(range(max(0, first * B - W + 1) // B, first))
        indices.update(dict.fromkeys(i for i in range(max(0, end - W + 1) // B, _ceil_div(end, B))
                                     if i >= first or slots.has(table[i])))
        held = list(indices)
        slots.hold([table[i] for i in held])
        state.window_held = dict.fromkeys(held)

    def settle_load(self, state, ticket) -> None:
        """Window data the records lacked, or that did not load, is let go (tombstones)."""
        first = ticket.run.first_index
        held = state.window_held
        gone = [first + i for i in ticket.unwindowed] + [
            i for i in held if i >= first + ticket.loaded]
        for i in dict.fromkeys(gone):
            if i in held:
                del held[i]
                self.slots.drop([state.block_table[i]])

    # -- what to release ------------------------------------------------------------------
    def keep(self, state, namespace: str, tokens: Sequence[int], n: int, result) -> None:
        """The tree keeps the window data of the blocks it holds for ``tokens[:n]`` that the
        sequence holds (the rest has none, or is kept already); new cached blocks without
        any are announced so."""
        if n == 0:
            return
        node = result.handle.node if result.handle is not None else \
            self.tree.probe(namespace, tokens[:n]).node
        if node is None:
            return
        blocks = node.path_blocks(self.block_size)[:_ceil_div(n, self.block_size)]
        self.slots.keep(blocks[i] for i in state.window_held if i < len(blocks))
        fresh = blocks[result.cached_before // self.block_size:]
        self.announce([b for b in fresh if not self.slots.has(b)])

    def release(self, state, table: list[int]) -> None:
        held, state.window_held = state.window_held, {}
        if held:
            self.slots.drop([table[i] for i in held])



def window_pool_counts(kv, running) -> Mapping | None:
    """The window layers' pool (``KVCache.window``) at a moment: its layers, window, blocks
    free / kept by the tree / held by running requests, tombstones made, bytes per token
    of the window layers and of the main pool's; None without one."""
    window = kv.window
    if window is None:
        return None
    held = {b for seq in running for b in seq.kv.window_ids(seq.kv.block_table)}
    per_layer = kv.bytes_per_token // kv.num_layers
    return MappingProxyType({
        "window": window.window, "layers": sorted(kv.window_layers),
        "blocks": window.pool.num_blocks, "free": window.pool.num_free(),
        "cached": len(window.kept), "in_use": len(held), "tombstoned": window.tombstoned,
        "bytes_per_token": per_layer * len(kv.window_layers),
        "main_bytes_per_token": per_layer * (kv.num_layers - len(kv.window_layers))})


__all__ = ["WindowGroup", "window_pool_counts"]
