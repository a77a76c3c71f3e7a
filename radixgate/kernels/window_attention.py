"""Paged attention with a sliding window and soft-capped scores (Mistral, Gemma 2/3), in
torch ops: the layers whose attention the fast paths (native, Triton, SDPA) do not cover.

Same contract and KV layout as ``reference_paged_attention`` (docs/ARCHITECTURE.md section
3), plus:
- ``window`` W > 0: a query at position p sees the keys at p - W + 1 ... p (HF's sliding
  window: W keys, its own included). Only the blocks some query's window reaches are read.
- ``softcap`` c > 0: every score s becomes ``c * tanh(s / c)`` before the mask and softmax.
Scores and softmax are float32 whatever the activations' dtype, computed for tiles of query
rows whose scores stay under ``SCORE_BYTES`` (a window without soft-caps: torch's SDPA with the
window's mask); the result is in q's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from radixgate.kernels.checks import check_attention_inputs
from radixgate.kernels.reference import dequantize_kv


def window_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, cu_q_lens: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, *, window: int = 0, softcap: float = 0.0,
                     k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of ragged queries q [T, Hq, D] over paged K/V -> [T, Hq, D], each
    sequence on its own (the module docstring has ``window`` and ``softcap``)."""
    check_attention_inputs(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens,
                           k_scale, v_scale)
    out = torch.empty_like(q)
    bounds = cu_q_lens.tolist()
    for b, total in enumerate(seq_lens.tolist()):
        begin, end = bounds[b], bounds[b + 1]
        first = total - (end - begin)                         # position of the first query
        start = max(0, first - window + 1) if window > 0 else 0
        k, v = (_positions(cache, scales, block_tables[b], start, total, q.dtype)
                for cache, scales in ((k_cache, k_scale), (v_cache, v_scale)))
        rows = _rows_per_tile(q.shape[1], k.shape[0])
        for r in range(begin, end, rows):              # bounded scores: [Hq, rows, L] each
            last = min(r + rows, end)
            out[r:last] = _attend(q[r:last], k, v, first + r - begin, start, scale, window,
                                  softcap)
    return out


SCORE_BYTES = 64 << 20            # float32 scores of one tile of query rows, at most


def _rows_per_tile(num_heads: int, keys: int) -> int:
    return max(1, SCORE_BYTES // (4 * num_heads * max(keys, 1)))


def _positions(cache: torch.Tensor, scales: torch.Tensor | None, table: torch.Tensor,
               start: int, total: int, dtype: torch.dtype) -> torch.Tensor:
    """Positions [start, total) of one sequence as ``dtype``: [total - start, Hkv, D]."""
    block_size = cache.shape[1]
    first_block, last_block = start // block_size, (total - 1) // block_size
    blocks = table[first_block:last_block + 1].long()
    offset = start - first_block * block_size

    def pick(t):
        return t.index_select(0, blocks).flatten(0, 1)[offset:offset + total - start]
    return dequantize_kv(pick(cache), None if scales is None else pick(scales), dtype)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int, start: int,
            scale: float, window: int, softcap: float) -> torch.Tensor:
    """Queries at positions first, first + 1, ... over keys at start, start + 1, ...:
    q [Lq, Hq, D], k and v [L, Hkv, D] -> [Lq, Hq, D]."""
    q_len, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    query_pos = torch.arange(first, first + q_len)[:, None]
    key_pos = torch.arange(start, start + k.shape[0])[None, :]
    hidden = key_pos > query_pos
    if window > 0:
        hidden |= key_pos <= query_pos - window
    if softcap <= 0:                                  # a window only: SDPA with its mask
        out = F.scaled_dot_product_attention(
            q.float().transpose(0, 1)[None], k.float().transpose(0, 1)[None],
            v.float().transpose(0, 1)[None], attn_mask=~hidden, scale=scale,
            enable_gqa=num_heads != num_kv_heads)                         # [1, Hq, Lq, D]
        return out[0].transpose(0, 1).to(q.dtype)
    group = num_heads // num_kv_heads
    qg = q.float().view(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)  # [Hkv, G, Lq, D]
    kf, vf = k.float().permute(1, 0, 2), v.float().permute(1, 0, 2)           # [Hkv, L, D]
    scores = torch.matmul(qg, kf.unsqueeze(1).transpose(-1, -2)).mul_(scale)  # [Hkv, G, Lq, L]
    scores.div_(softcap).tanh_().mul_(softcap)
    probs = torch.softmax(scores.masked_fill_(hidden, float("-inf")), dim=-1)
    out = torch.matmul(probs, vf.unsqueeze(1))                              # [Hkv, G, Lq, D]
    return out.permute(2, 0, 1, 3).reshape(q_len, num_heads, head_dim).to(q.dtype)
