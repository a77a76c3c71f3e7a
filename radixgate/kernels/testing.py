"""Builders of random paged-KV cases for the kernel tests and benchmarks (no pytest dependency).

``make_paged_case`` scatters every sequence's K/V over shuffled blocks of a cache whose unused
slots hold ``fill`` (NaN by default, so a kernel that reads a slot it should not shows up), and
keeps the same K/V contiguous for checking against unpaged attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedCase:
    q: torch.Tensor             # [T, Hq, D] new tokens' queries
    k_cache: torch.Tensor       # [num_blocks, bs, Hkv, D] every position already stored
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [B, max_blocks], -1 padded
    cu_q_lens: torch.Tensor     # int32 [B + 1]
    seq_lens: torch.Tensor      # int32 [B]
    slot_mapping: torch.Tensor  # int64 [T] slots of the new tokens
    keys: list[torch.Tensor]    # per sequence [L_b, Hkv, D], contiguous (unpaged)
    values: list[torch.Tensor]
    q_lens: list[int]

    def new_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the new tokens, concatenated: [T, Hkv, D] each."""
        k = torch.cat([key[len(key) - n:] for key, n in zip(self.keys, self.q_lens)])
        v = torch.cat([val[len(val) - n:] for val, n in zip(self.values, self.q_lens)])
        return k, v

    def finite_caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the caches with the unused (NaN) slots zeroed, for the reference."""
        return self.k_cache.nan_to_num(0.0), self.v_cache.nan_to_num(0.0)


def make_paged_case(q_lens: list[int], seq_lens: list[int], *, num_heads: int, num_kv_heads: int,
                    head_dim: int, block_size: int, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu", seed: int = 0,
                    fill: float = float("nan"), spare_blocks: int = 2) -> PagedCase:
    """A batch where sequence b has seq_lens[b] tokens, the last q_lens[b] of them new."""
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-length // block_size) for length in seq_lens]
    num_blocks = sum(needed) + spare_blocks
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((len(seq_lens), max(needed) + 1), -1, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, fill, dtype=dtype)
    v_cache = torch.full(shape, fill, dtype=dtype)
    keys, values, new_slots = [], [], []
    for b, (length, n_new) in enumerate(zip(seq_lens, q_lens)):
        blocks = [order.pop() for _ in range(needed[b])]
        tables[b, :len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        slots = slots_for(blocks, block_size, 0, length)                      # [L]
        key = torch.randn(length, num_kv_heads, head_dim, generator=gen).to(dtype)
        value = torch.randn(length, num_kv_heads, head_dim, generator=gen).to(dtype)
        k_cache[slots // block_size, slots % block_size] = key
        v_cache[slots // block_size, slots % block_size] = value
        keys.append(key)
        values.append(value)
        new_slots.append(slots[length - n_new:])
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=gen).to(dtype)
    cu = torch.tensor([0] + q_lens, dtype=torch.int64).cumsum(0).to(torch.int32)
    return PagedCase(q.to(device), k_cache.to(device), v_cache.to(device), tables.to(device),
                     cu.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device),
                     torch.cat(new_slots).to(device), [k.to(device) for k in keys],
                     [v.to(device) for v in values], list(q_lens))


def slots_for(blocks: list[int], block_size: int, begin: int, end: int) -> torch.Tensor:
    """Slot ids (int64) of positions [begin, end) of a sequence whose block table is ``blocks``."""
    positions = torch.arange(begin, end)
    table = torch.tensor(blocks, dtype=torch.int64)
    return table[positions // block_size] * block_size + positions % block_size


def contiguous_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                         scale: float) -> torch.Tensor:
    """Unpaged reference: q [n, Hq, D] are the last n positions of keys/values [L, Hkv, D].

    Uses SDPA with K/V repeated to Hq heads and an explicit causal-with-offset mask, so it shares
    no code path with ``reference_paged_attention``.
    """
    n, num_heads, _ = q.shape
    length = keys.shape[0]
    group = num_heads // keys.shape[1]
    k = keys.repeat_interleave(group, dim=1).transpose(0, 1)                  # [Hq, L, D]
    v = values.repeat_interleave(group, dim=1).transpose(0, 1)
    query_pos = torch.arange(length - n, length)[:, None]                     # [n, 1]
    mask = torch.arange(length)[None, :] <= query_pos                         # [n, L]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k, v, attn_mask=mask.to(q.device), scale=scale)   # [Hq, n, D]
    return out.transpose(0, 1)
