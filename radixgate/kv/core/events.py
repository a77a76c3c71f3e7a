"""Cache events a router (or a metrics sink) can consume: blocks stored in / removed from the tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal


@dataclass(frozen=True, slots=True)
class CacheEvent:
    """One tree node gained (``stored``) or lost (``removed``) blocks.

    ``blocks`` are the block ids for block indices ``start // B .. (end - 1) // B`` of the
    token range ``[start, end)`` in its namespace: the node's whole range, or for an
    eviction that trims a leaf's tail only the dropped part (``start`` is then on a block
    boundary and the node keeps ``[node.start, start)``). Splits emit nothing: they only
    re-divide a stored range. When an extension lets a node swap its partial last block for
    the extending request's copy, the node emits ``removed`` (reason ``replaced``) and then
    ``stored`` for that block's part of its range.

    ``tokens``: for a ``stored`` event of a new node, the packed int32 token ids of its whole
    path ``[0, end)`` (what content addresses, ``block_hash.py``, are computed from; an
    immutable bytes object the tree already had, so a sink may keep it); empty otherwise.
    Not part of equality or repr (it is the path's content, named by the range already).

    ``window_removed`` (reason ``window``): the window layers' pool let go of these cached
    blocks' K/V (kv.WindowSlots: tombstones); the global layers keep them, and
    ``namespace`` is empty (the pool is shared; ``start`` and ``end`` are 0).
    """

    kind: Literal["stored", "removed", "window_removed"]
    namespace: str
    blocks: tuple[int, ...]
    start: int
    end: int
    reason: str = ""  # for "removed": "lru", "ttl", "flush" or "replaced"
    tokens: bytes = field(default=b"", compare=False, repr=False)


EventSink = Callable[[CacheEvent], None]


class EventFanout:
    """One stream of ``CacheEvent``s handed to every subscriber, in the order they
    subscribed, each event to all of them before the next.

    Built before the tree and given to its constructor (``RadixTree(pool,
    on_event=fanout)``): whoever wants the tree's events then subscribes. Without a
    subscriber it is false, and the tree builds no event. Events arrive on the thread that
    changes the tree (the engine thread); a subscriber must not block or touch the tree.
    """

    __slots__ = ("_sinks",)

    def __init__(self, *sinks: EventSink):
        self._sinks = sinks

    def subscribe(self, sink: EventSink) -> None:
        """``sink`` gets every event from now on, after the earlier subscribers. Call it
        before the thread that changes the tree starts, or on that thread."""
        self._sinks += (sink,)

    def __bool__(self) -> bool:
        return bool(self._sinks)

    def __call__(self, event: CacheEvent) -> None:
        for sink in self._sinks:
            sink(event)
