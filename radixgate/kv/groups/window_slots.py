"""WindowSlots: the second KV pool, of sliding-window layers (docs/ARCHITECTURE.md section 9b).

A model whose layers mix global attention with a sliding window of W tokens (Gemma 2/3,
Mistral) keeps two pools. The main ``BlockPool`` ids name a block of every position (the
tree, tables and copy-on-write speak of them only); the global layers store K/V there. The
window layers store theirs in a smaller pool of *window ids*, and ``index`` maps each main
block to its window id, or to ``trash`` (the spare block no one writes) when it has none: a
**tombstone**. The model reads window layers through that map.

Window ids are refcounted by the holders that need the window data:
- a running sequence holds the blocks of its last W positions and of the tokens it computes
  next (``hold``), and drops the ones its window has passed (``drop``);
- the tree keeps one reference on each cached block that still has window data (``keep``),
  given up under pressure, least recently useful first (``evict``, which returns the blocks
  it tombstoned), never on the blocks it is told are protected (the last W positions of a
  pinned prefix: kv/groups/window.py decides); and when the main block itself is freed
  (``on_main_free``, the hook the main pool is built with).

A cached prefix of length L is usable when its blocks covering positions ``L - W + 1 ..
L - 1`` have window data (``usable_reuse`` backs off to the nearest shorter length that is).
Pure Python: ``index`` is an ``array('i')`` the runtime views as a tensor without copying.
"""
from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence

from ..core.pool import BlockPool


class WindowSlots:
    """Window ids for ``num_main`` main blocks from a pool of ``num_window`` blocks of
    ``block_size`` slots; the window is ``window`` tokens (a key at ``p - W + 1`` is the oldest a
    query at ``p`` sees)."""

    def __init__(self, num_main: int, num_window: int, block_size: int, window: int):
        if num_window < 1 or window < 1:
            raise ValueError(f"need a window pool and a window, got {num_window} blocks, W={window}")
        self.pool = BlockPool(num_window, block_size)
        self.block_size, self.window = block_size, window
        self.trash = num_window                      # the spare block: zeros, never written
        self.index = array("i", [num_window]) * num_main
        self.kept: OrderedDict[int, None] = OrderedDict()   # main blocks the tree keeps, LRU first
        self.tombstoned = 0                                  # tree blocks given up (counter)

    # -- the map -------------------------------------------------------------------------
    def has(self, block: int) -> bool:
        return self.index[block] != self.trash

    def window_id(self, block: int) -> int:
        return self.index[block]

    # -- holders -------------------------------------------------------------------------
    def hold(self, blocks: Sequence[int]) -> None:
        """A running sequence takes a reference on each block's window data (``blocks``
        distinct); blocks without one get a fresh window id. All or nothing: ``OutOfBlocks``
        leaves nothing held."""
        fresh = [b for b in blocks if not self.has(b)]
        ids = self.pool.allocate(len(fresh))             # raises OutOfBlocks before any change
        self.pool.incref_held([self.index[b] for b in blocks if self.has(b)])
        for block, wid in zip(fresh, ids):
            self.index[block] = wid

    def drop(self, blocks: Iterable[int]) -> None:
        """Give back references taken by ``hold``; a window id no one holds goes free and its
        block is a tombstone from then on."""
        for block in blocks:
            wid = self.index[block]
            if wid == self.trash:
                raise ValueError(f"drop of block {block}, which has no window data")
            if self.pool.decref(wid):
                self.index[block] = self.trash

    # -- the tree's references -----------------------------------------------------------
    def keep(self, blocks: Iterable[int]) -> None:
        """The tree caches ``blocks``: it keeps those that have window data (once each)."""
        for block in blocks:
            if block in self.kept:
                self.kept.move_to_end(block)
            elif self.has(block):
                self.pool.incref(self.index[block])
                self.kept[block] = None

    def touch(self, blocks: Iterable[int]) -> None:
        """A match used these blocks' window data: evict them last."""
        for block in blocks:
            if block in self.kept:
                self.kept.move_to_end(block)

    def on_main_free(self, block: int) -> None:
        """The main pool's hook: ``block`` went free, so its window data goes too (only the
        tree can still hold it then: a running sequence holds its main block)."""
        if block in self.kept:
            del self.kept[block]
            self._release_kept(block)

    def evict(self, num_ids: int, protected: Collection[int] = ()) -> list[int]:
        """Tombstone the tree's least recently useful blocks until ``num_ids`` window ids are
        free (skipping ones a running sequence also holds, and ``protected``). Returns the
        blocks tombstoned (each freed one id): the caller tells the KV events."""
        victims = []
        for block in list(self.kept):
            if self.pool.num_free() >= num_ids:
                break
            if block in protected or self.pool.refcount(self.index[block]) > 1:
                continue
            del self.kept[block]
            self._release_kept(block)
            victims.append(block)
        return victims

    def _release_kept(self, block: int) -> int:
        self.tombstoned += 1
        wid = self.index[block]
        if self.pool.decref(wid):
            self.index[block] = self.trash
            return 1
        return 0

    # -- what a match may reuse ----------------------------------------------------------
    def needed(self, table: Sequence[int], first: int, end: int) -> list[int]:
        """The blocks of ``table`` whose window data queries at ``first .. end - 1`` read."""
        lo = max(0, first - self.window + 1) // self.block_size
        hi = -(-end // self.block_size)
        return list(table[lo:hi])

    def usable_reuse(self, table: Sequence[int], length: int) -> int:
        """The longest reuse ``<= length`` of a cached path (``table``: its blocks) whose
        window layers hold what the first computed query reads (``length`` itself, or the
        nearest shorter point; 0 always is)."""
        B, W = self.block_size, self.window
        while length > 0:
            lo = max(0, length - W + 1) // B
            gaps = [i for i in range(lo, -(-length // B)) if not self.has(table[i])]
            if not gaps:
                return length
            # every usable point past the last gap lies beyond ``length``: go below the gap
            length = gaps[-1] * B
        return 0

    # -- accounting ----------------------------------------------------------------------
    def stats(self) -> dict:
        return {"blocks": self.pool.num_blocks, "free": self.pool.num_free(),
                "cached_blocks": len(self.kept), "tombstoned": self.tombstoned,
                "window": self.window}

    def check(self, tree_blocks: set[int], holds: Iterable[Sequence[int]]) -> None:
        """Recount every window id: its refcount is the tree's reference (a kept block the
        tree holds) plus the running sequences' holds; a free id maps from no block; free +
        held == total (raises AssertionError)."""
        expected: dict[int, int] = {}
        for block in self.kept:
            if block not in tree_blocks:
                raise AssertionError(f"window data kept for block {block}, which the tree lacks")
            expected[block] = expected.get(block, 0) + 1
        for seq_blocks in holds:
            for block in seq_blocks:
                expected[block] = expected.get(block, 0) + 1
        owners: dict[int, int] = {}
        for block, wid in enumerate(self.index):
            if wid != self.trash:
                if wid in owners:
                    raise AssertionError(f"window id {wid} mapped from blocks {owners[wid]} and {block}")
                owners[wid] = block
        for wid, block in owners.items():
            got, want = self.pool.refcount(wid), expected.get(block, 0)
            if got != want:
                raise AssertionError(f"window id {wid} (block {block}): refcount {got}, "
                                     f"holders {want}")
        missing = [b for b in expected if not self.has(b)]
        if missing:
            raise AssertionError(f"blocks {missing[:8]} are held without window data")
        if self.pool.num_free() + len(owners) != self.pool.num_blocks:
            raise AssertionError(f"window pool: free {self.pool.num_free()} + held {len(owners)}"
                                 f" != {self.pool.num_blocks}")


__all__ = ["WindowSlots"]
