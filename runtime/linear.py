"""``linear(x, w)``: ``F.linear`` that runs multi-row fp32 inputs on the CPU through oneDNN with a
prepacked copy of the weight.

On this project's AVX2 CPUs MKL's sgemm is slow for the skinny products of batched decode (16
rows) and prefill; oneDNN's linear over a weight reordered once into its blocked layout runs them
faster (measured in benchmarks/forward_speed.py). Single-row inputs (one decoding sequence) stay
on ``F.linear``, whose GEMV is as fast. The packed copy costs the weight's size again in memory.
Set ``RADIXGATE_PACKED_LINEAR=0`` to turn packing off (every call is then ``F.linear``); torch
builds without the oneDNN ops fall back the same way.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

PACKED_LINEAR_ENV = "RADIXGATE_PACKED_LINEAR"
_PACK_ROWS_HINT = 16          # the row count oneDNN tunes the packed layout for


def _packing_works() -> bool:
    """oneDNN ops present and agreeing with F.linear on a small product."""
    if os.environ.get(PACKED_LINEAR_ENV, "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        w, x = torch.randn(24, 40, generator=gen), torch.randn(5, 40, generator=gen)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, _PACK_ROWS_HINT)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.allclose(out, F.linear(x, w), atol=1e-4, rtol=1e-4))
    except (AttributeError, RuntimeError):
        return False


class Linear:
    """``Linear(weight [N, K], bias [N] | None)``; calling it on x [M, K] returns [M, N]."""

    _enabled: bool | None = None    # decided once per process

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight, self.bias = weight, bias
        self.packed = None
        if weight.device.type == "cpu" and weight.dtype == torch.float32 and self._can_pack():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_ROWS_HINT)

    @classmethod
    def _can_pack(cls) -> bool:
        if cls._enabled is None:
            cls._enabled = _packing_works()
        return cls._enabled

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or x.dim() != 2 or x.shape[0] == 1:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias,
                                                  "none", [], "")
