"""The KV cache's element types (``[cache] kv_dtype``) and what a token costs in each: the
one list and the one bytes-per-token formula (pure Python; the torch dtypes behind the names
are radixgate/runtime/model/kv_dtypes.py's).

    bytes per token = 2 (K and V) x layers x kv_heads x (head_dim x bytes per number + scale)

where the 8-bit dtypes (``int8``, ``fp8`` e4m3) keep one float16 scale per (token, kv head)
of K and of V (``scale`` = 2 bytes; 0 for the float dtypes).
"""
from __future__ import annotations

# bytes per number of each ``[cache] kv_dtype``
KV_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "fp8": 1}
QUANTIZED_KV_DTYPES = ("int8", "fp8")
KV_SCALE_BYTES = 2
KV_DTYPES = ("auto", *KV_DTYPE_BYTES)     # what ``[cache] kv_dtype`` accepts (auto: the model's)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                       kv_dtype: str | int) -> int:
    """Bytes one token's K and V take in every layer: ``kv_dtype`` names a KV dtype (the
    8-bit ones' scales included) or is a plain number of bytes per number (no scales)."""
    if isinstance(kv_dtype, str):
        if kv_dtype not in KV_DTYPE_BYTES:
            raise ValueError(f"kv dtype must be one of {', '.join(KV_DTYPE_BYTES)}, "
                             f"got {kv_dtype!r}")
        per_number = KV_DTYPE_BYTES[kv_dtype]
        scale = KV_SCALE_BYTES if kv_dtype in QUANTIZED_KV_DTYPES else 0
    else:
        if kv_dtype <= 0:
            raise ValueError(f"bytes per number must be positive, got {kv_dtype}")
        per_number, scale = kv_dtype, 0
    return 2 * num_layers * num_kv_heads * (head_dim * per_number + scale)
