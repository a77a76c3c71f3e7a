"""``ForwardBatch``: one model step's inputs (the KV layout of docs/ARCHITECTURE.md section 3)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor       # int64 [T]  all new tokens of all sequences, concatenated
    positions: torch.Tensor       # int64 [T]
    slot_mapping: torch.Tensor    # int64 [T]  block * B + slot for each new token (-1 = skip)
    block_tables: torch.Tensor    # int32 [batch, max_blocks] padded with -1
    cu_q_lens: torch.Tensor       # int32 [batch + 1]
    seq_lens: torch.Tensor        # int32 [batch] total tokens incl. new ones
    logits_indices: torch.Tensor  # int64 [n] rows of the T tokens whose logits are wanted
    slot_bounds: tuple[int, int] | None = None   # lowest and highest slot (None: unknown)
    deterministic: bool = False   # every row's bits independent of the step's make-up

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]


def build_forward_batch(new_tokens: Sequence[Sequence[int]], num_cached: Sequence[int],
                        block_tables: Sequence[Sequence[int]], block_size: int,
                        device: str | torch.device = "cpu",
                        logits_rows: Sequence[Sequence[int]] | None = None,
                        deterministic: bool = False) -> ForwardBatch:
    """Build a batch from Python lists, copying each field to ``device`` once.

    Sequence ``b`` already has ``num_cached[b]`` tokens in the cache and appends
    ``new_tokens[b]`` at positions ``num_cached[b]...``; ``block_tables[b]`` must cover them.
    ``logits_rows[b]`` lists which of its new tokens want logits (default: the last one).
    ``deterministic``: the model's deterministic mode for this step (``LlamaModel.forward``).
    """
    ids, positions, slots, cu, lens, wanted = [], [], [], [0], [], []
    for b, (tokens, start, table) in enumerate(zip(new_tokens, num_cached, block_tables)):
        rows = logits_rows[b] if logits_rows is not None else [len(tokens) - 1]
        wanted += [cu[-1] + r for r in rows]
        for pos in range(start, start + len(tokens)):
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
        ids += list(tokens)
        cu.append(cu[-1] + len(tokens))
        lens.append(start + len(tokens))
    width = max((len(t) for t in block_tables), default=0)
    padded = [list(t) + [-1] * (width - len(t)) for t in block_tables]

    def tensor(values, dtype):
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    return ForwardBatch(tensor(ids, torch.int64), tensor(positions, torch.int64),
                        tensor(slots, torch.int64), tensor(padded, torch.int32),
                        tensor(cu, torch.int32), tensor(lens, torch.int32),
                        tensor(wanted, torch.int64),
                        (min(slots), max(slots)) if slots else None, deterministic)
