"""The torch dtype behind each ``[cache] kv_dtype`` name. The names, their sizes and the
bytes-per-token formula are radixgate/kv/dtypes.py's (pure Python, shared with the config
and the planner); this map covers exactly those names (tests/test_kv_dtype.py)."""
from __future__ import annotations

import torch

from radixgate.kv.dtypes import KV_DTYPE_BYTES

KV_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                   "float16": torch.float16, "int8": torch.int8, "fp8": torch.float8_e4m3fn}
KV_DTYPE_NAMES = {v: k for k, v in KV_TORCH_DTYPES.items()}
SCALE_DTYPE = torch.float16                 # the 8-bit dtypes' scales (KV_SCALE_BYTES each)

if KV_TORCH_DTYPES.keys() != KV_DTYPE_BYTES.keys():
    raise ImportError("KV_TORCH_DTYPES must name exactly kv.dtypes.KV_DTYPE_BYTES")
