"""Triton kernels that write the paged KV cache: ``store_kv`` and ``copy_blocks``.

Imported lazily by ``radixgate.kernels`` (importing this module imports Triton but compiles
nothing; each kernel is JIT-compiled on its first launch). References: ``reference.py``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixgate.kernels.checks import check_copy_inputs, check_store_inputs


@triton.jit
def store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    block_size, num_kv_heads, head_dim,
    HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr,
):
    """One program per token: copy its [Hkv, D] key and value into its slot (-1: skip); the
    store casts them to the cache's float dtype (round to nearest on a GPU; the interpreter
    truncates float32 -> bfloat16)."""
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    if slot < 0:
        return
    heads = tl.arange(0, HEADS_PAD)[:, None]                      # [H, 1]
    dims = tl.arange(0, DIM_PAD)[None, :]                         # [1, D]
    mask = (heads < num_kv_heads) & (dims < head_dim)
    cache_off = (slot // block_size) * stride_cb + (slot % block_size) * stride_cs \
        + heads * stride_ch + dims                                # [H, D]
    key = tl.load(k_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    value = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(k_cache_ptr + cache_off, key, mask=mask)
    tl.store(v_cache_ptr + cache_off, value, mask=mask)


@triton.jit
def copy_blocks_kernel(
    k_cache_ptr, v_cache_ptr, pairs_ptr, num_slots_ptr,
    stride_cb, stride_cs, stride_ch,
    num_kv_heads, head_dim,
    HEADS_PAD: tl.constexpr, DIM_PAD: tl.constexpr,
):
    """Program (pair, slot): copy one slot of the source block into the destination block."""
    pair = tl.program_id(0)
    slot = tl.program_id(1)
    if slot >= tl.load(num_slots_ptr + pair):
        return
    src = tl.load(pairs_ptr + 2 * pair)
    dst = tl.load(pairs_ptr + 2 * pair + 1)
    heads = tl.arange(0, HEADS_PAD)[:, None]                      # [H, 1]
    dims = tl.arange(0, DIM_PAD)[None, :]                         # [1, D]
    mask = (heads < num_kv_heads) & (dims < head_dim)
    inner = slot * stride_cs + heads * stride_ch + dims           # [H, D]
    src_off = src * stride_cb + inner
    dst_off = dst * stride_cb + inner
    tl.store(k_cache_ptr + dst_off, tl.load(k_cache_ptr + src_off, mask=mask), mask=mask)
    tl.store(v_cache_ptr + dst_off, tl.load(v_cache_ptr + src_off, mask=mask), mask=mask)


def head_pads(k_cache: torch.Tensor) -> dict:
    """Power-of-two tile sizes covering [Hkv, D] (meta-parameters of both kernels here)."""
    return dict(HEADS_PAD=triton.next_power_of_2(k_cache.shape[2]),
                DIM_PAD=triton.next_power_of_2(k_cache.shape[3]))


def _check_same_strides(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.stride() != v_cache.stride():
        raise ValueError(f"k_cache strides {k_cache.stride()} differ from v_cache strides {v_cache.stride()}")


def triton_store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Triton ``store_kv``: same contract as ``reference_store_kv`` (no bounds check on slots)."""
    check_store_inputs(k, v, k_cache, v_cache, slot_mapping)
    _check_same_strides(k_cache, v_cache)
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    store_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_cache.shape[1], k_cache.shape[2], k_cache.shape[3],
        **head_pads(k_cache),
    )


def triton_copy_blocks(k_cache, v_cache, pairs, num_slots) -> None:
    """Triton ``copy_blocks`` for ONE layer: same contract as ``reference_copy_blocks``."""
    check_copy_inputs(k_cache, v_cache, pairs, num_slots)
    _check_same_strides(k_cache, v_cache)
    if pairs.shape[0] == 0:
        return
    pairs = pairs.contiguous()
    copy_blocks_kernel[(pairs.shape[0], k_cache.shape[1])](
        k_cache, v_cache, pairs, num_slots,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        k_cache.shape[2], k_cache.shape[3],
        **head_pads(k_cache),
    )
