"""The full-attention group: its layers read every cached position from the main pool, so a
match reuses everything and a sequence holds nothing beyond its main blocks."""
from __future__ import annotations

from collections.abc import Sequence


class FullAttentionGroup:
    """The trivial ``AttentionGroup`` (groups/base.py): ``holds`` is False, every answer is
    "all of it" and every hold is empty."""

    holds = False

    def usable_reuse(self, blocks: Sequence[int], reuse: int) -> int:
        return reuse

    def loadable(self, found_blocks: Sequence[int], run, num_tokens: int) -> bool:
        return True

    def hold_reused(self, state, table: list[int], reuse: int, copies: int) -> bool:
        return True

    def begin_copy(self, shared: int, private: int) -> bool:
        return False

    def end_copy(self, shared: int, private: int, began: bool, copied: bool) -> None:
        pass

    def reserve(self, state, num_computed: int, end: int) -> bool:
        return True

    def hold_loading(self, state, table: list[int], first: int, run, num_tokens: int) -> None:
        pass

    def settle_load(self, state, ticket) -> None:
        pass

    def keep(self, state, namespace: str, tokens: Sequence[int], n: int, result) -> None:
        pass

    def release(self, state, table: list[int]) -> None:
        pass


__all__ = ["FullAttentionGroup"]
