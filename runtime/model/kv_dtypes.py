"""Bytes of each ``[cache] kv_dtype`` (no imports: the planner and the KV cache share it)."""
from __future__ import annotations

# bytes per number of each ``[cache] kv_dtype``; the 8-bit ones also keep a float16 scale
# per (token, kv head) of K and of V (runtime/model/kv_cache.py, kernels/reference.py)
KV_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "fp8": 1}
QUANTIZED_KV_DTYPES = ("int8", "fp8")
KV_SCALE_BYTES = 2


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, kv_dtype: str) -> int:
    """Bytes one token's K and V take in every layer when kept as ``kv_dtype``, scales included."""
    if kv_dtype not in KV_DTYPE_BYTES:
        raise ValueError(f"kv dtype must be one of {', '.join(KV_DTYPE_BYTES)}, got {kv_dtype!r}")
    scale = KV_SCALE_BYTES if kv_dtype in QUANTIZED_KV_DTYPES else 0
    return 2 * num_layers * num_kv_heads * (head_dim * KV_DTYPE_BYTES[kv_dtype] + scale)
