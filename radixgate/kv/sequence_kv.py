"""SequenceKV: one request's KV state, kept by the ``KVManager`` (engine thread only).

- ``block_table``: the main blocks of positions ``[0, len * B)`` (position ``i`` in slot
  ``i % B`` of ``block_table[i // B]``); the sequence holds one pool reference per entry,
  from ``admit`` / ``grow`` until ``release``. The model reads it every step.
- ``lock_handle``: the tree lock on its cached path while it runs (``admit`` takes it from
  the match, ``insert_prefilled`` / ``finish_load`` move it, ``release`` drops it).
- ``window_held``: the table indices whose window-layer data it holds (the window group,
  kv/groups/window.py).
- ``prefill_inserted``: the tokens present at admission are computed and in the tree.
- ``tier_load``: the lower tier's ``LoadJob`` while its prefix loads (kv/tiers/base.py);
  ``tier_chain``: ``(len(tokens), their full-block hashes)`` kept for the tier's look-ups;
  ``disk_read``: prompt tokens the tier loaded at its admission.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SequenceKV:
    block_table: list[int] = field(default_factory=list)
    lock_handle: object = None                  # core.node.LockHandle
    window_held: dict[int, None] = field(default_factory=dict)
    prefill_inserted: bool = False
    tier_load: object = None                    # tiers.base.LoadJob
    tier_chain: tuple | None = None
    disk_read: int = 0

    def blocks_needed(self, num_tokens: int, block_size: int) -> int:
        """Blocks to add so positions [0, num_tokens) have a block."""
        return max(0, -(-num_tokens // block_size) - len(self.block_table))

    def window_ids(self, table: list[int]) -> list[int]:
        """The blocks of ``table`` whose window-layer data this sequence holds."""
        return [table[i] for i in self.window_held]


__all__ = ["SequenceKV"]
