"""The attention-group interface: what one kind of attention layer needs of a sequence's blocks.

The main pool's block ids name a block of every position (the tree, tables and copy-on-write
speak of them only). A group adds what its layers need beyond that, in three questions:

- **what a match may reuse**: ``usable_reuse`` backs a reuse off to where the group's layers
  hold what the first computed query reads;
- **what a step must hold**: ``hold_reused`` at admission, ``reserve`` before each step,
  ``hold_loading`` / ``settle_load`` around a lower tier's load, ``begin_copy`` /
  ``end_copy`` around a copy-on-write;
- **what to release**: ``release`` (the sequence ends or is preempted), ``keep`` (the tree
  now caches the sequence's first tokens and takes its own reference).

A group keeps its per-sequence state on the sequence's KV state (``state``: a
``SequenceKV``, kv/sequence_kv.py: its ``block_table`` and the group's own field, e.g.
``window_held``). ``holds`` is False
for a group that keeps nothing (full attention): the manager skips it on every path.
Only the engine thread calls a group (through the ``KVManager``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class AttentionGroup(Protocol):
    holds: bool

    # -- what a match may reuse ---------------------------------------------------------
    def usable_reuse(self, blocks: Sequence[int], reuse: int) -> int:
        """The longest reuse ``<= reuse`` of a cached path (``blocks``) the group can serve."""

    def loadable(self, found_blocks: Sequence[int], run, num_tokens: int) -> bool:
        """Whether a lower tier's ``run`` past a memory match (``found_blocks``) may be
        loaded (room made for what the load will hold)."""

    # -- what a step must hold ----------------------------------------------------------
    def hold_reused(self, state, table: list[int], reuse: int, copies: int) -> bool:
        """Admission: hold what queries from ``reuse`` on read of ``table``, with room for
        ``copies`` copy-on-write blocks. False (nothing held) when there is no room."""

    def begin_copy(self, shared: int, private: int) -> bool:
        """A copy-on-write of ``shared`` into ``private`` starts; True when the group took
        something for it (given to ``end_copy``)."""

    def end_copy(self, shared: int, private: int, began: bool, copied: bool) -> None:
        """The copy is done (``copied``) or failed: settle what ``begin_copy`` took."""

    def reserve(self, state, num_computed: int, end: int) -> bool:
        """Before a step computes positions up to ``end``: hold what it reads and writes,
        let go of what the group no longer needs. False (nothing changes) when short."""

    def hold_loading(self, state, table: list[int], first: int, run, num_tokens: int) -> None:
        """A lower tier's load of ``run`` into ``table[first:]`` is queued: hold what the
        loaded prefix's end reads."""

    def settle_load(self, state, ticket) -> None:
        """The load is done: let go of what did not load."""

    # -- what to release ----------------------------------------------------------------
    def keep(self, state, namespace: str, tokens: Sequence[int], n: int, result) -> None:
        """The tree now caches ``tokens[:n]`` (``result``: its insert's)."""

    def release(self, state, table: list[int]) -> None:
        """Drop everything the sequence holds in this group (``table``: its blocks)."""


__all__ = ["AttentionGroup"]
