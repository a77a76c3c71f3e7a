"""BlockPool: a free list plus one refcount per KV block (pure Python, block ids are ints).

The refcount of a block is the number of its holders: tree nodes and running requests
(docs/ARCHITECTURE.md section 3). A block is free exactly when its refcount is 0; ``decref`` to 0 puts
it back on the free list. Misuse (double free, incref of a free block, unknown id) raises
``BlockPoolError`` at once instead of corrupting the cache silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class OutOfBlocks(Exception):
    """``allocate(n)`` was asked for more blocks than are free."""


class BlockPoolError(Exception):
    """A reference-counting mistake: double free, decref below zero, unknown block."""


class BlockPool:
    """``num_blocks`` KV blocks of ``block_size`` token slots each; ``on_free`` (or None)
    is called with each block that goes back to the free list (a second pool's hook:
    ``WindowSlots.on_main_free``)."""

    def __init__(self, num_blocks: int, block_size: int,
                 on_free: Callable[[int], None] | None = None):
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._refcounts = [0] * num_blocks
        # Stack: allocate pops from the end, so a fresh pool hands out 0, 1, 2, ...
        self._free = list(range(num_blocks - 1, -1, -1))
        self.on_free = on_free

    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free blocks; each comes back with refcount 1 (the caller's reference)."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} blocks")
        if n > len(self._free):
            raise OutOfBlocks(f"need {n} blocks but only {len(self._free)} of {self.num_blocks} are free")
        if n == 0:
            return []
        blocks = self._free[-n:]
        del self._free[-n:]
        blocks.reverse()
        refcounts = self._refcounts
        for block in blocks:
            refcounts[block] = 1
        return blocks

    def incref(self, block: int) -> None:
        """Add a holder to an allocated block (incref of a free block is an error)."""
        self._check_id(block)
        if self._refcounts[block] == 0:
            raise BlockPoolError(f"incref of free block {block}: nobody holds it, its contents are gone")
        self._refcounts[block] += 1

    def decref(self, block: int) -> bool:
        """Drop a holder; True when the block went back to the free list."""
        self._check_id(block)
        count = self._refcounts[block]
        if count == 0:
            raise BlockPoolError(f"decref of free block {block} (double free or refcount below zero)")
        self._refcounts[block] = count - 1
        if count == 1:
            self._free.append(block)
            if self.on_free is not None:
                self.on_free(block)
            return True
        return False

    def incref_many(self, blocks: Iterable[int]) -> None:
        """``incref`` each block (the hot path of insert); all-or-nothing on error."""
        refcounts, num_blocks = self._refcounts, self.num_blocks
        blocks = list(blocks)
        for block in blocks:
            if type(block) is not int or not 0 <= block < num_blocks or refcounts[block] == 0:
                self._raise_for_incref(block)
        for block in blocks:
            refcounts[block] += 1

    def incref_held(self, blocks: list[int]) -> None:
        """``incref`` blocks known to be held already (by tree nodes): no checks."""
        refcounts = self._refcounts
        for block in blocks:
            refcounts[block] += 1

    def decref_many(self, blocks: Iterable[int]) -> int:
        """``decref`` each block; returns how many went back to the free list. On a bad
        block it raises, with the blocks before it already released."""
        refcounts, num_blocks, free = self._refcounts, self.num_blocks, self._free
        on_free, freed = self.on_free, 0
        for block in blocks:
            if type(block) is not int or not 0 <= block < num_blocks or refcounts[block] == 0:
                self.decref(block)          # raises the precise error
            count = refcounts[block]
            refcounts[block] = count - 1
            if count == 1:
                free.append(block)
                freed += 1
                if on_free is not None:
                    on_free(block)
        return freed

    def refcount(self, block: int) -> int:
        self._check_id(block)
        return self._refcounts[block]

    def free_blocks(self) -> list[int]:
        """A copy of the free list (for integrity checks and tests)."""
        return list(self._free)

    def _raise_for_incref(self, block: int) -> None:
        self._check_id(block)
        raise BlockPoolError(f"incref of free block {block}: nobody holds it, its contents are gone")

    def _check_id(self, block: int) -> None:
        if not (isinstance(block, int) and 0 <= block < self.num_blocks):
            raise BlockPoolError(f"unknown block {block!r} (pool has blocks 0..{self.num_blocks - 1})")
