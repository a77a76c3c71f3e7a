"""Triton paged attention: a decode kernel (one query per sequence) and a prefill / prefix-extend
kernel (ragged query tiles), both with online softmax over paged K/V. Spec: ``reference.py``.
Both process all query heads of a GQA group together, so each K/V tile is read once per group.

Imported lazily by ``radixgate.kernels``; kernels are JIT-compiled on first launch.
Launch decisions use shapes only (never tensor values), so launching does not synchronise:
``T == batch`` selects the decode kernel (valid because every sequence has q_len >= 1), and
the prefill grid is an upper bound on the number of query tiles (see ``_prefill_kernel``).
"""
from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from radixgate.kernels.checks import check_attention_inputs

LOG2_E = 1.4426950408889634


@triton.jit
def _attend_tile(q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, table_row_ptr, tokens, tok_valid,
                 keep, kv_head, dims, dim_mask, BLOCK_SIZE: tl.constexpr, stride_cb, stride_cs, stride_ch,
                 scale_log2, DOT_FP32: tl.constexpr):
    """Online-softmax update of (acc [M, D], m_i [M], l_i [M]) with keys ``tokens`` [N].

    tok_valid [N]: keys to load (< seq_len); keep [M, N]: which (query, key) pairs count.
    Scores live in the log2 domain. DOT_FP32 upcasts the matmul inputs (only set under the
    Triton interpreter, whose bf16 dot is wrong).
    """
    block_ids = tl.load(table_row_ptr + tokens // BLOCK_SIZE, mask=tok_valid, other=0).to(tl.int64)
    kv_off = block_ids * stride_cb + (tokens % BLOCK_SIZE).to(tl.int64) * stride_cs \
        + kv_head * stride_ch                                                 # [N]
    kv_mask = tok_valid[:, None] & dim_mask[None, :]                          # [N, D]
    k = tl.load(k_cache_ptr + kv_off[:, None] + dims[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_off[:, None] + dims[None, :], mask=kv_mask, other=0.0)
    k, v = k.to(q.dtype), v.to(q.dtype)      # a cache in another float dtype is read as q's
    if DOT_FP32:
        q, k, v = q.to(tl.float32), k.to(tl.float32), v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale_log2           # [M, N]
    s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))                                     # [M]
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])                                           # [M, N]
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return acc, m_new, l_i


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, seq_lens_ptr,
    part_m_ptr, part_l_ptr, part_acc_ptr,
    scale_log2, tiles_per_split,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_cs, stride_ch,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """Program (seq, kv_head, split): all GROUP query heads of one kv head read each K/V tile once.

    With NUM_SPLITS > 1 each split covers ``tiles_per_split`` key tiles and writes partial
    (m, l, acc) for ``_decode_reduce_kernel``; otherwise it writes the output directly.
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    rows = tl.arange(0, GROUP_PAD)                                            # [G]
    dims = tl.arange(0, DIM_PAD)                                              # [D]
    row_mask = rows < GROUP
    dim_mask = dims < HEAD_DIM
    heads = kv_head * GROUP + rows                                            # [G]
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=row_mask[:, None] & dim_mask[None, :], other=0.0)        # [G, D]
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    tile_begin = split * tiles_per_split
    tile_end = tl.minimum(tl.cdiv(seq_len, BLOCK_N), tile_begin + tiles_per_split)
    table_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile in range(tile_begin, tile_end):
        tokens = tile * BLOCK_N + tl.arange(0, BLOCK_N)                       # [N]
        tok_valid = tokens < seq_len
        keep = tok_valid[None, :] & (rows >= 0)[:, None]                      # [G, N]
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, table_row_ptr,
                                     tokens, tok_valid, keep, kv_head, dims, dim_mask, BLOCK_SIZE,
                                     stride_cb, stride_cs, stride_ch, scale_log2, DOT_FP32)
    out_mask = row_mask[:, None] & dim_mask[None, :]
    if NUM_SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(out_ptr + seq * stride_ot + heads[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        part = (seq * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split  # [G]
        tl.store(part_m_ptr + part, m_i, mask=row_mask)
        tl.store(part_l_ptr + part, l_i, mask=row_mask)
        tl.store(part_acc_ptr + part[:, None] * DIM_PAD + dims[None, :], acc, mask=out_mask)


@triton.jit
def _decode_reduce_kernel(
    out_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    """Program (seq, head): merge the NUM_SPLITS partial softmax states into the output."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, NUM_SPLITS)                                         # [S]
    dims = tl.arange(0, DIM_PAD)                                              # [D]
    part = (seq * tl.num_programs(1) + head) * NUM_SPLITS + splits            # [S]
    m = tl.load(part_m_ptr + part)
    weight = tl.exp2(m - tl.max(m, 0))                                        # [S], 0 for empty splits
    l_total = tl.sum(tl.load(part_l_ptr + part) * weight, 0)
    acc = tl.load(part_acc_ptr + part[:, None] * DIM_PAD + dims[None, :])     # [S, D]
    out = tl.sum(acc * weight[:, None], 0) / l_total                          # [D]
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + dims,
             out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, cu_q_lens_ptr, seq_lens_ptr,
    scale_log2, num_seqs,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_cs, stride_ch,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    SEARCH_STEPS: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """Program (tile, kv_head): BLOCK_Q queries of one sequence times the GROUP query heads that
    share kv_head (BLOCK_Q * GROUP_PAD rows, so each K/V tile is read once per group), causal
    with offset.

    Sequence b owns tiles ``[cu[b] // BLOCK_Q + b, cu[b+1] // BLOCK_Q + b + 1)``: at least
    ceil(q_len / BLOCK_Q) of them, so a grid of ``T // BLOCK_Q + batch`` tiles covers every query
    without reading lengths on the host. Tiles past a sequence's queries exit at once.
    """
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    lo = tile * 0
    hi = tile * 0 + num_seqs
    for _ in range(SEARCH_STEPS):  # largest seq with first tile <= tile
        mid = (lo + hi) // 2
        go_right = tl.load(cu_q_lens_ptr + mid) // BLOCK_Q + mid <= tile
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
    seq = lo
    q_start = tl.load(cu_q_lens_ptr + seq)
    q_len = tl.load(cu_q_lens_ptr + seq + 1) - q_start
    local = tile - (q_start // BLOCK_Q + seq)
    if local * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len
    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)                                  # [M] = query x head
    query = local * BLOCK_Q + rows // GROUP_PAD                               # [M] query index
    group_slot = rows % GROUP_PAD
    heads = kv_head * GROUP + group_slot                                      # [M]
    dims = tl.arange(0, DIM_PAD)                                              # [D]
    dim_mask = dims < HEAD_DIM
    io_mask = ((query < q_len) & (group_slot < GROUP))[:, None] & dim_mask[None, :]
    q_rows = (q_start + query).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=io_mask, other=0.0)                                      # [M, D]
    query_pos = prefix + query                                                # [M] (>= seq_len on padding rows)
    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, DIM_PAD], tl.float32)
    kv_end = tl.minimum(seq_len, prefix + (local + 1) * BLOCK_Q)
    table_row_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for kv_start in range(0, kv_end, BLOCK_N):
        tokens = kv_start + tl.arange(0, BLOCK_N)                             # [N]
        tok_valid = tokens < kv_end
        keep = (tokens[None, :] <= query_pos[:, None]) & tok_valid[None, :]   # [M, N]
        acc, m_i, l_i = _attend_tile(q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, table_row_ptr,
                                     tokens, tok_valid, keep, kv_head, dims, dim_mask, BLOCK_SIZE,
                                     stride_cb, stride_cs, stride_ch, scale_log2, DOT_FP32)
    out = acc / l_i[:, None]
    tl.store(out_ptr + q_rows[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=io_mask)


def _dot_fp32(q: torch.Tensor) -> bool:
    """The Triton interpreter computes bf16 tl.dot wrongly: upcast there (only there)."""
    return q.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def decode_num_splits(batch: int, num_kv_heads: int, max_tiles: int, device: torch.device) -> int:
    """Split the keys of each (seq, kv head) when there are too few programs to fill the GPU."""
    programs = batch * num_kv_heads
    sms = _sm_count(device.index or 0) if device.type == "cuda" else 128
    if programs >= 2 * sms or max_tiles < 8:
        return 1
    wanted = min(16, triton.cdiv(2 * sms, programs), max_tiles // 4)
    return 1 << (max(wanted, 1).bit_length() - 1)                             # power of two


def triton_paged_attention(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens, scale,
                           *, num_splits: int | None = None, block_m: int | None = None,
                           block_n: int | None = None) -> torch.Tensor:
    """Triton ``paged_attention``: same contract as ``reference_paged_attention``.

    ``num_splits`` (decode) and ``block_m`` / ``block_n`` (prefill) override the tile choices;
    they exist for tests and tuning.
    """
    check_attention_inputs(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens)
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables must be contiguous along max_blocks (stride(1) == 1)")
    if k_cache.stride() != v_cache.stride():
        raise ValueError(f"k_cache strides {k_cache.stride()} differ from v_cache strides {v_cache.stride()}")
    for name, tile in (("block_m", block_m), ("block_n", block_n)):
        if tile is not None and (tile < 16 or tile & (tile - 1)):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot minimum), got {tile}")
    out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    if q.shape[0] == block_tables.shape[0]:
        launches = decode_launches(q, k_cache, v_cache, block_tables, seq_lens, scale, out,
                                   num_splits, block_n)
    else:
        launches = [prefill_launch(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens, scale, out,
                                   block_m, block_n)]
    for kernel, grid, args, meta in launches:
        kernel[grid](**args, **meta)
    return out


def decode_launches(q, k_cache, v_cache, block_tables, seq_lens, scale, out, num_splits=None,
                    block_n=None) -> list[tuple]:
    """(kernel, grid, args, meta) for the decode kernel and, when split, its reduction."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    block_n = block_n or 64
    max_tiles = triton.cdiv(block_tables.shape[1] * k_cache.shape[1], block_n)
    if num_splits is None:
        num_splits = decode_num_splits(batch, num_kv_heads, max_tiles, q.device)
    if num_splits < 1 or num_splits & (num_splits - 1):
        raise ValueError(f"num_splits must be a power of two, got {num_splits}")
    part_m = part_l = part_acc = out  # unused placeholders when NUM_SPLITS == 1
    if num_splits > 1:
        part_m = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(batch, num_heads, num_splits, dim_pad, dtype=torch.float32, device=q.device)
    args = dict(
        q_ptr=q, k_cache_ptr=k_cache, v_cache_ptr=v_cache, out_ptr=out, block_tables_ptr=block_tables,
        seq_lens_ptr=seq_lens, part_m_ptr=part_m, part_l_ptr=part_l, part_acc_ptr=part_acc,
        scale_log2=scale * LOG2_E,
        tiles_per_split=triton.cdiv(max_tiles, num_splits),
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_bt=block_tables.stride(0), stride_cb=k_cache.stride(0), stride_cs=k_cache.stride(1),
        stride_ch=k_cache.stride(2),
    )
    meta = dict(BLOCK_SIZE=k_cache.shape[1], GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
                HEAD_DIM=head_dim, DIM_PAD=dim_pad, BLOCK_N=block_n, NUM_SPLITS=num_splits,
                DOT_FP32=_dot_fp32(q), num_warps=4, num_stages=2)
    launches = [(_decode_kernel, (batch, num_kv_heads, num_splits), args, meta)]
    if num_splits > 1:
        reduce_args = dict(out_ptr=out, part_m_ptr=part_m, part_l_ptr=part_l, part_acc_ptr=part_acc,
                           stride_ot=out.stride(0), stride_oh=out.stride(1))
        reduce_meta = dict(HEAD_DIM=head_dim, DIM_PAD=dim_pad, NUM_SPLITS=num_splits)
        launches.append((_decode_reduce_kernel, (batch, num_heads), reduce_args, reduce_meta))
    return launches


def prefill_launch(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens, scale, out,
                   block_m=None, block_n=None) -> tuple:
    """(kernel, grid, args, meta) for the prefill / prefix-extend kernel.

    block_m counts tile rows (queries x query heads of one group); a tile holds
    ``block_m // GROUP_PAD`` queries (at least one).
    """
    num_tokens, num_heads, head_dim = q.shape
    batch, num_kv_heads = block_tables.shape[0], k_cache.shape[2]
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    block_m, block_n = block_m or 64, block_n or 64
    block_q = max(1, block_m // group_pad)
    dim_pad = max(16, triton.next_power_of_2(head_dim))
    # sm_90 compile (ptxas -v, bf16, d128): 64x64 tiles with 8 warps, no spills (compile_check).
    num_warps = 8 if block_q * group_pad * dim_pad >= 64 * 128 else 4
    args = dict(
        q_ptr=q, k_cache_ptr=k_cache, v_cache_ptr=v_cache, out_ptr=out, block_tables_ptr=block_tables,
        cu_q_lens_ptr=cu_q_lens, seq_lens_ptr=seq_lens, scale_log2=scale * LOG2_E, num_seqs=batch,
        stride_qt=q.stride(0), stride_qh=q.stride(1), stride_ot=out.stride(0), stride_oh=out.stride(1),
        stride_bt=block_tables.stride(0), stride_cb=k_cache.stride(0), stride_cs=k_cache.stride(1),
        stride_ch=k_cache.stride(2),
    )
    meta = dict(GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim, DIM_PAD=dim_pad,
                BLOCK_SIZE=k_cache.shape[1], BLOCK_Q=block_q, BLOCK_N=block_n,
                SEARCH_STEPS=math.ceil(math.log2(batch)) if batch > 1 else 0, DOT_FP32=_dot_fp32(q),
                num_warps=num_warps, num_stages=2)
    return _prefill_kernel, (num_tokens // block_q + batch, num_kv_heads), args, meta
