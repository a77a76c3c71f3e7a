"""The page-rounded baseline: the ``KVManager`` as a hash-block cache (vLLM-style) would
reuse and cache, whole blocks only: a match is rounded down to a block boundary, and only
whole computed blocks go into the tree. The benchmarks compare the radix cache against it
(``[cache] page_rounded_match``)."""
from __future__ import annotations

from .manager import KVManager


class PageRoundedKVManager(KVManager):
    """``KVManager`` with reuse and inserts rounded down to whole blocks."""

    def reuse_length(self, matched: int, num_tokens: int) -> int:
        reuse = min(matched, num_tokens - 1)
        return max(reuse - reuse % self.block_size, 0)

    def round_reuse(self, reuse: int) -> int:
        return reuse - reuse % self.block_size

    def cacheable(self, num_computed: int) -> int:
        """Whole blocks only (a hash-block cache keeps no partial block)."""
        return num_computed - num_computed % self.block_size


__all__ = ["PageRoundedKVManager"]
