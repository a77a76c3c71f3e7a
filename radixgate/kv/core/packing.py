"""Packing queries into int32 bytes, once per request rather than once per call.

The engine matches a prompt, inserts it after prefill, then inserts prompt + output: three
calls over mostly the same tokens, usually as Python lists. ``QueryPacker`` remembers the
last few packed lists (a private copy and its bytes) and reuses the longest remembered
prefix. Reuse is exact: the copy is compared with ``==`` (by value; fast when the caller
passes the same int objects, e.g. a slice of the same list), so a caller that mutates its
list between calls still gets the right bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from .node import TOKEN_BYTES, pack_tokens


class QueryPacker:
    def __init__(self, size: int = 8):
        self._recent: deque[tuple[list[int], bytes]] = deque(maxlen=size)

    def pack(self, tokens: Sequence[int]) -> bytes:
        """``tokens`` as packed int32 bytes, reusing a remembered prefix when there is one."""
        if type(tokens) is not list or not tokens:
            return pack_tokens(tokens)
        copy, data, known = self._longest_prefix(tokens)
        n = len(tokens)
        if known == n and len(copy) == n:
            return data
        if known == n:
            data = data[:n * TOKEN_BYTES]
        else:
            data = data[:known * TOKEN_BYTES] + pack_tokens(tokens[known:])
        self._recent.append((list(tokens), data))
        return data

    def _longest_prefix(self, tokens: list[int]) -> tuple[list[int], bytes, int]:
        best: tuple[list[int], bytes, int] = ([], b"", 0)
        n = len(tokens)
        for copy, data in reversed(self._recent):
            k = min(n, len(copy))
            if k <= best[2] or copy[k - 1] != tokens[k - 1] or copy[k // 2] != tokens[k // 2]:
                continue
            same = copy == tokens if len(copy) == n else copy[:k] == tokens[:k]
            if same:
                best = (copy, data, k)
        return best
