"""Cache events a router (or a metrics sink) can consume: blocks stored in / removed from the tree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal


@dataclass(frozen=True, slots=True)
class CacheEvent:
    """One tree node gained (``stored``) or lost (``removed``) its blocks.

    ``blocks`` are the node's block ids for block indices ``start // B .. (end - 1) // B``;
    ``start``/``end`` is the node's token range ``[start, end)`` in its namespace. Splits emit
    nothing: they only re-divide a stored range.
    """

    kind: Literal["stored", "removed"]
    namespace: str
    blocks: tuple[int, ...]
    start: int
    end: int
    reason: str = ""  # for "removed": "lru", "ttl" or "flush"


EventSink = Callable[[CacheEvent], None]
