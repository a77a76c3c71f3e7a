"""Input checks shared by the reference ops and the Triton launchers.

Only shapes, dtypes, devices and strides are checked here: nothing reads tensor values, so the
checks never synchronise with a GPU. Each failure raises ``ValueError`` naming the argument.
"""
from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# 8-bit KV caches: codes plus one float16 scale per (token, kv head) (reference.py)
QUANTIZED_DTYPES = (torch.int8, torch.float8_e4m3fn)
SCALE_DTYPE = torch.float16


def _fail(message: str) -> None:
    raise ValueError(message)


def check_cache_pair(k_cache: torch.Tensor, v_cache: torch.Tensor, k_scale=None,
                     v_scale=None) -> None:
    """k_cache, v_cache: [num_blocks, block_size, Hkv, D], same shape/dtype/device, last dim
    contiguous; a float dtype without scales, or int8 / float8_e4m3fn with float16 scales
    k_scale, v_scale [num_blocks, block_size, Hkv]."""
    if k_cache.dim() != 4:
        _fail(f"k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        _fail(f"v_cache shape {tuple(v_cache.shape)} differs from k_cache shape {tuple(k_cache.shape)}")
    if k_cache.dtype not in FLOAT_DTYPES + QUANTIZED_DTYPES or v_cache.dtype != k_cache.dtype:
        _fail(f"k_cache/v_cache must share a float or 8-bit dtype, got {k_cache.dtype} and {v_cache.dtype}")
    _check_scales(k_cache, k_scale, v_scale)
    if v_cache.device != k_cache.device:
        _fail(f"k_cache on {k_cache.device} but v_cache on {v_cache.device}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        _fail("k_cache and v_cache must be contiguous in head_dim (stride(-1) == 1)")


def _check_scales(k_cache: torch.Tensor, k_scale, v_scale) -> None:
    if k_cache.dtype in FLOAT_DTYPES:
        if k_scale is not None or v_scale is not None:
            _fail(f"k_scale/v_scale are for 8-bit caches only, the cache is {k_cache.dtype}")
        return
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is None:
            _fail(f"a {k_cache.dtype} cache needs {name} (float16 [num_blocks, block_size, Hkv])")
        if t.dtype != SCALE_DTYPE or t.shape != k_cache.shape[:3] or t.device != k_cache.device:
            _fail(f"{name} must be {SCALE_DTYPE} {tuple(k_cache.shape[:3])} on {k_cache.device}, "
                  f"got {t.dtype} {tuple(t.shape)} on {t.device}")


def check_store_inputs(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """k, v: [T, Hkv, D] float, matching the cache; slot_mapping: int64 [T]."""
    check_cache_pair(k_cache, v_cache, k_scale, v_scale)
    _, _, num_kv_heads, head_dim = k_cache.shape
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 3 or t.shape[1:] != (num_kv_heads, head_dim):
            _fail(f"{name} must be [T, {num_kv_heads}, {head_dim}] to match the cache, got {tuple(t.shape)}")
        if t.device != k_cache.device:
            _fail(f"{name} on {t.device} but the cache is on {k_cache.device}")
        if t.stride(-1) != 1:
            _fail(f"{name} must be contiguous in head_dim (stride(-1) == 1)")
        if t.dtype not in FLOAT_DTYPES:
            _fail(f"{name} must be a float tensor, got {t.dtype}")
    if v.shape[0] != k.shape[0]:
        _fail(f"k has {k.shape[0]} tokens but v has {v.shape[0]}")
    _check_index(slot_mapping, "slot_mapping", torch.int64, (k.shape[0],), k_cache.device)


def check_attention_inputs(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens,
                           k_scale=None, v_scale=None) -> None:
    """q: [T, Hq, D] float (any float dtype: K/V are read as q's dtype); block_tables int32
    [B, M]; cu_q_lens int32 [B+1]; seq_lens int32 [B]."""
    check_query_and_caches(q, k_cache, v_cache, k_scale, v_scale)
    check_tables_device(q, block_tables)
    check_index_inputs(block_tables, cu_q_lens, seq_lens)


def check_tables_device(q, block_tables) -> None:
    """The tables (and, by ``check_index_inputs``, the lengths) on q's device."""
    if block_tables.device != q.device:
        _fail(f"block_tables on {block_tables.device} but q is on {q.device}")


def check_index_inputs(block_tables, cu_q_lens, seq_lens) -> None:
    """block_tables int32 [B, M]; cu_q_lens int32 [B+1]; seq_lens int32 [B], one device."""
    if block_tables.dim() != 2:
        _fail(f"block_tables must be [batch, max_blocks], got shape {tuple(block_tables.shape)}")
    batch = block_tables.shape[0]
    device = block_tables.device
    _check_index(block_tables, "block_tables", torch.int32, None, device)
    _check_index(cu_q_lens, "cu_q_lens", torch.int32, (batch + 1,), device)
    _check_index(seq_lens, "seq_lens", torch.int32, (batch,), device)


def check_query_and_caches(q, k_cache, v_cache, k_scale=None, v_scale=None) -> None:
    """q: [T, Hq, D] float on the caches' device, Hq a multiple of their Hkv."""
    check_cache_pair(k_cache, v_cache, k_scale, v_scale)
    _, _, num_kv_heads, head_dim = k_cache.shape
    if q.dim() != 3 or q.shape[2] != head_dim:
        _fail(f"q must be [T, num_heads, {head_dim}], got shape {tuple(q.shape)}")
    if q.dtype not in FLOAT_DTYPES:
        _fail(f"q must be a float tensor, got {q.dtype}")
    if q.device != k_cache.device:
        _fail(f"q on {q.device} but the cache is on {k_cache.device}")
    if q.stride(-1) != 1:
        _fail("q must be contiguous in head_dim (stride(-1) == 1)")
    if q.shape[1] % num_kv_heads != 0:
        _fail(f"num query heads {q.shape[1]} is not a multiple of num kv heads {num_kv_heads}")


def check_copy_inputs(k_cache, v_cache, pairs, num_slots, k_scale=None, v_scale=None) -> None:
    """pairs: int64 [n, 2] (src, dst); num_slots: int32 [n]."""
    check_cache_pair(k_cache, v_cache, k_scale, v_scale)
    if pairs.dim() != 2 or pairs.shape[1] != 2:
        _fail(f"pairs must be [n, 2] (src, dst), got shape {tuple(pairs.shape)}")
    _check_index(pairs, "pairs", torch.int64, None, k_cache.device)
    _check_index(num_slots, "num_slots", torch.int32, (pairs.shape[0],), k_cache.device)


def _check_index(t, name, dtype, shape, device) -> None:
    if t.dtype != dtype:
        _fail(f"{name} must be {dtype}, got {t.dtype}")
    if shape is not None and tuple(t.shape) != shape:
        _fail(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        _fail(f"{name} on {t.device} but expected {device}")
