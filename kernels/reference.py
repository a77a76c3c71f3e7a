"""Plain-torch KV ops: the specification of every kernel and the CPU path of the model.

Layout (DESIGN.md section 5): per layer ``k_cache``/``v_cache`` are
``[num_blocks, block_size, Hkv, D]``; position ``i`` of a sequence lives in slot
``i % block_size`` of block ``block_table[i // block_size]``. Slot ids are ``block * block_size
+ slot``. Everything here is vectorised: decode rows of a batch go through one batched
``scaled_dot_product_attention``; each multi-token (prefill / prefix-extend) sequence goes through
one SDPA call on its gathered, contiguous K/V (a loop over sequences, never over tokens). GQA is
handled without materialising repeated K/V.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from radixgate.kernels.checks import check_attention_inputs, check_copy_inputs, check_store_inputs


def reference_store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write k[t], v[t] ([T, Hkv, D]) into slot ``slot_mapping[t]`` of the caches, in place.

    Tokens whose slot is -1 are skipped (padding). Slots must be distinct.
    """
    check_store_inputs(k, v, k_cache, v_cache, slot_mapping)
    num_blocks, block_size = k_cache.shape[:2]
    valid = slot_mapping >= 0                                  # [T] bool
    if not bool(valid.all()):
        k, v, slot_mapping = k[valid], v[valid], slot_mapping[valid]
    if slot_mapping.numel() == 0:
        return
    if not k_cache.is_cuda and int(slot_mapping.max()) >= num_blocks * block_size:
        raise ValueError(f"slot {int(slot_mapping.max())} is beyond the cache ({num_blocks} x {block_size} slots)")
    blocks, slots = slot_mapping // block_size, slot_mapping % block_size
    k_cache[blocks, slots] = k                                 # [T', Hkv, D]
    v_cache[blocks, slots] = v


def reference_copy_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, pairs: torch.Tensor,
                          num_slots: torch.Tensor) -> None:
    """Copy slots ``[0, num_slots[i])`` of block ``pairs[i, 0]`` into block ``pairs[i, 1]``.

    Takes ONE layer's caches: callers loop over layers. Used for copy-on-write when a request's
    reused prefix ends inside a block it does not own. All reads happen before any write, but a
    destination must not also be a source in the same call (the Triton kernel copies pairs in
    parallel), and destinations must be distinct.
    """
    check_copy_inputs(k_cache, v_cache, pairs, num_slots)
    if pairs.shape[0] == 0:
        return
    block_size = k_cache.shape[1]
    slot_ids = torch.arange(block_size, device=pairs.device)             # [bs]
    keep = slot_ids[None, :] < num_slots.to(torch.int64)[:, None]        # [n, bs]
    src = pairs[:, 0:1].expand(-1, block_size)[keep]                     # [m]
    dst = pairs[:, 1:2].expand(-1, block_size)[keep]                     # [m]
    slots = slot_ids[None, :].expand(pairs.shape[0], -1)[keep]           # [m]
    for cache in (k_cache, v_cache):
        cache[dst, slots] = cache[src, slots]                            # [m, Hkv, D]


def reference_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              block_tables: torch.Tensor, cu_q_lens: torch.Tensor,
                              seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of ragged queries over paged K/V. Returns [T, Hq, D].

    q: [T, Hq, D], the new tokens of every sequence concatenated (sequence b owns rows
    ``cu_q_lens[b]:cu_q_lens[b+1]``; every sequence has at least one). Query i of sequence b sits
    at position ``seq_lens[b] - q_len_b + i`` and attends to positions ``<=`` its own, all read
    from the cache (store_kv runs first). Query head h reads kv head ``h // (Hq // Hkv)``.
    """
    check_attention_inputs(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens)
    q_lens, lens = _validated_lengths(q, k_cache, block_tables, cu_q_lens, seq_lens)
    if all(n == 1 for n in q_lens):  # pure decode batch: no scatter needed
        return _decode_attention(q, k_cache, v_cache, block_tables, seq_lens, max(lens), scale)
    out = torch.empty_like(q)
    starts = cu_q_lens.tolist()
    decode = [b for b, n in enumerate(q_lens) if n == 1]
    if decode:
        pick = torch.tensor(decode, device=q.device)
        rows = cu_q_lens[pick].to(torch.int64)
        out[rows] = _decode_attention(q[rows], k_cache, v_cache, block_tables[pick], seq_lens[pick],
                                      max(lens[b] for b in decode), scale)
    for b, n in enumerate(q_lens):
        if n > 1:
            begin = starts[b]
            out[begin:begin + n] = _extend_attention(q[begin:begin + n], k_cache, v_cache,
                                                     block_tables[b], lens[b], scale)
    return out


def _validated_lengths(q, k_cache, block_tables, cu_q_lens, seq_lens) -> tuple[list[int], list[int]]:
    """Per-sequence query lengths and total lengths as Python lists, checked for consistency."""
    starts = cu_q_lens.tolist()
    lens = seq_lens.tolist()
    q_lens = [e - s for s, e in zip(starts, starts[1:])]
    capacity = block_tables.shape[1] * k_cache.shape[1]
    if starts[0] != 0 or starts[-1] != q.shape[0]:
        raise ValueError(f"cu_q_lens must run from 0 to T={q.shape[0]}, got {starts[0]}..{starts[-1]}")
    for b, (n, total) in enumerate(zip(q_lens, lens)):
        if not 1 <= n <= total:
            raise ValueError(f"sequence {b}: need 1 <= q_len ({n}) <= seq_len ({total})")
        if total > capacity:
            raise ValueError(f"sequence {b}: seq_len {total} exceeds block table capacity {capacity}")
    return q_lens, lens


def _gather_blocks(cache: torch.Tensor, tables: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """[n, num_blocks] block ids (-1 padding read as block 0) -> [n, num_blocks * bs, Hkv, D]."""
    ids = tables[:, :num_blocks].clamp_min(0).to(torch.int64)            # [n, nb]
    gathered = cache.index_select(0, ids.reshape(-1))                     # [n*nb, bs, Hkv, D]
    return gathered.view(tables.shape[0], num_blocks * cache.shape[1], *cache.shape[2:])


def _decode_attention(q, k_cache, v_cache, tables, lens: torch.Tensor, max_len: int,
                      scale: float) -> torch.Tensor:
    """One query per sequence. q: [n, Hq, D]; tables: [n, M]; lens: [n] -> [n, Hq, D]."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    num_blocks = -(-max_len // k_cache.shape[1])
    k = _gather_blocks(k_cache, tables, num_blocks).transpose(1, 2)        # [n, Hkv, L, D]
    v = _gather_blocks(v_cache, tables, num_blocks).transpose(1, 2)        # [n, Hkv, L, D]
    positions = torch.arange(k.shape[2], device=q.device)                 # [L]
    mask = (positions[None, :] < lens[:, None])[:, None, None, :]         # [n, 1, 1, L]
    grouped = q.reshape(n, num_kv_heads, num_heads // num_kv_heads, head_dim)  # [n, Hkv, G, D]
    out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask, scale=scale)
    return out.reshape(n, num_heads, head_dim)


def _extend_attention(q, k_cache, v_cache, table, total: int, scale: float) -> torch.Tensor:
    """One sequence's q_len > 1 queries at positions [total - q_len, total). -> [q_len, Hq, D]."""
    q_len, num_heads, _ = q.shape
    num_kv_heads = k_cache.shape[2]
    num_blocks = -(-total // k_cache.shape[1])
    k = _gather_blocks(k_cache, table[None], num_blocks)[0, :total]       # [L, Hkv, D]
    v = _gather_blocks(v_cache, table[None], num_blocks)[0, :total]
    q4 = q.transpose(0, 1)[None]                                          # [1, Hq, Lq, D]
    k4, v4 = k.transpose(0, 1)[None], v.transpose(0, 1)[None]              # [1, Hkv, L, D]
    gqa = num_heads != num_kv_heads
    if q_len == total:
        out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        query_pos = torch.arange(total - q_len, total, device=q.device)   # [Lq]
        mask = query_pos[:, None] >= torch.arange(total, device=q.device)[None, :]  # [Lq, L]
        out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out[0].transpose(0, 1)                                        # [Lq, Hq, D]
