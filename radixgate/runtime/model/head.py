"""``RescoredHead``: the output head of an int4 model read from a GGUF file, as int8 rows
with the top logits of every row recomputed exactly.

The head is the largest single matrix of a small model (SmolLM2-135M: 49,152 x 576, a third
of the bytes a decode step reads in int4). In bf16 it costs 56 MB a token; here it is 28 MB
of int8 codes with one scale per row (requantized from the file's blocks), multiplied by the
activations quantized per row to int8 (``torch.ops.aten._int_mm``: faster than the
weight-only int8 op at every row count, 1.6x bf16 at one row). Those logits are
approximate; the ``k`` largest of each row are then recomputed in float32 from the file's
own rows (``exact_rows``, the embedding lookup for a tied head), so what greedy decoding,
top logprobs and most sampled tokens see is exact, closer than the bf16 head came.

Measured (SmolLM2, 57 prompt positions, against float32 over the dequantized file): bf16
head max |diff| 0.20, top-1 agreement 98.2%, top-5 error 0.12; this head: top-32 exact
(2.7e-5), top-1 100%, the tail beyond them mean 0.13 / max 1.5. A decode step of one row
8.0 -> 7.4 ms; 16 rows 1.74 -> 2.41 ms for the head. Token choices below the top ``k`` (a
grammar excluding all of them, a high temperature's tail) see the approximate values.

On a CPU with AMX (Sapphire Rapids) one or two rows go through torch's weight-only int8 op
with bf16 activations instead: ``_int_mm`` of one row costs 1.8x there (1.8 vs 1.0 ms
warm; in a decode step, where the 28 MB come from memory, 2.67 vs 2.42 ms, the step 1.5%
faster). A 4-bit head would read half the bytes (1.3 ms less a step) but its approximate
logits were 3.5x further off (mean 0.43, max 4.7 on SmolLM2 hidden states): not taken.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from radixgate.kernels import native
from radixgate.runtime.model.linear import cpu_flags, has_int8_op, quantize_int8_rows

TOP_EXACT = 32               # OpenAI's top_logprobs go up to 20


WEIGHT_ONLY_MAX_ROWS = 2    # measured: 1 row 1.0 vs 1.8 ms, 4 rows even, 16 rows 6.6 vs 2.2 ms


def weight_only_wins() -> bool:
    """On CPUs with AMX (Sapphire Rapids and later) oneDNN's ``_int_mm`` of one row costs
    1.8x torch's weight-only int8 op (49,152 x 576, 2 threads); on AVX-512 without AMX
    (AMD EPYC) ``_int_mm`` was the faster at every row count."""
    return has_int8_op() and "amx_int8" in cpu_flags()


def int_mm_available() -> bool:
    """``torch.ops.aten._int_mm`` runs on this CPU (int8 x int8 -> int32)."""
    if not hasattr(torch.ops.aten, "_int_mm"):
        return False
    try:
        a = torch.ones(1, 32, dtype=torch.int8)
        return int(torch.ops.aten._int_mm(a, torch.ones(32, 8, dtype=torch.int8))[0, 0]) == 32
    except RuntimeError:
        return False


NATIVE_TOPK_MAX_ROWS = 4    # one pass in C: 1 row 23 vs 53 us warm (in a step 0.3 ms); 16 rows even


def _top_indices(logits: torch.Tensor, k: int, invariant: bool = False) -> torch.Tensor:
    """The indices of each row's k largest logits, in no order (``kernels.native`` for a
    few rows, or for all with ``invariant``: one rule for ties whatever the row count; else
    torch's topk)."""
    few = logits.shape[0] <= NATIVE_TOPK_MAX_ROWS or invariant
    if few and k <= native.TOPK_MAX and native.usable(logits):
        return native.topk_indices(logits, k)
    return logits.topk(k, dim=1, sorted=False).indices


class RescoredHead:
    """``head(h)``: float32 logits [n, V] of hidden states h [n, H] (see the module
    docstring), from int8 ``codes`` [V, H] with one float32 ``scale`` [V] per row
    (``w ~ codes * scale``); ``exact_rows(ids)`` gives float32 rows [len(ids), H] of the
    exact weight. Built by ``from_weight`` or ``from_blocks``."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor,
                 exact_rows: Callable[[torch.Tensor], torch.Tensor], k: int = TOP_EXACT):
        self.shape, self.dtype, self.scale = tuple(codes.shape), torch.int8, scale
        self.codes = codes.contiguous()                   # [V, H]: the weight-only op's layout
        self.codes_t = self.codes.t()                     # [H, V] view: _int_mm's fast layout
        self.scale_bf16 = scale.to(torch.bfloat16)        # [V] the weight-only op's scale
        self.weight_only_rows = WEIGHT_ONLY_MAX_ROWS if weight_only_wins() else 0
        self.exact_rows, self.k = exact_rows, min(k, self.shape[0])


    @classmethod
    def from_weight(cls, weight: torch.Tensor,
                    exact_rows: Callable[[torch.Tensor], torch.Tensor],
                    k: int = TOP_EXACT) -> RescoredHead:
        """From a float32 weight [V, H] (read once here)."""
        return cls(*quantize_int8_rows(weight), exact_rows, k)

    @classmethod
    def from_blocks(cls, codes: torch.Tensor, scales: torch.Tensor,
                    exact_rows: Callable[[torch.Tensor], torch.Tensor],
                    k: int = TOP_EXACT) -> RescoredHead:
        """From Q8_0 blocks (int8 codes [V, B, 32], float16 scales [V, B, 1]), without a
        float32 copy of the whole weight (the file's dequantizer took 0.8 s at start)."""
        block_scale = scales.to(torch.float32)                                      # [V, B, 1]
        row_max = (codes.abs().amax(2, keepdim=True).to(torch.float32) * block_scale.abs())
        scale = (row_max.amax(dim=(1, 2)) / 127).clamp(min=1e-12)                  # [V]
        factor = block_scale / scale[:, None, None]
        requantized = torch.round(codes.to(torch.float32).mul_(factor)).clamp_(-127, 127)
        return cls(requantized.to(torch.int8).view(codes.shape[0], -1), scale, exact_rows, k)

    def __call__(self, h: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """``invariant`` (deterministic mode): a row's logits the same bits whatever rows it
        came with. ``_int_mm`` sums integers (exact in any order); the top-k then takes one
        tie rule, the exact rows are products of one fixed shape each (``torch.bmm`` over n
        rows picks its blocking by n), and the AMX hosts' weight-only op is not used."""
        h = h.to(torch.float32)
        if h.shape[0] == 0:
            return h.new_empty((0, self.shape[0]))
        logits = self.approximate(h, invariant)                                    # [n, V]
        top = _top_indices(logits, self.k, invariant)                              # [n, k]
        rows = self.exact_rows(top.reshape(-1)).view(*top.shape, -1)               # [n, k, H]
        rows = rows.to(h.device, torch.float32)
        if invariant:
            exact = torch.stack([torch.mv(rows[i], h[i]) for i in range(h.shape[0])])
        else:
            exact = torch.bmm(rows, h.unsqueeze(2)).squeeze(2)
        return logits.scatter_(1, top, exact)

    def approximate(self, h: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """int8 codes times the activations (bf16 through the weight-only op for a row or
        two where that wins, else quantized per row to int8 for ``_int_mm``): float32 [n, V]."""
        if h.shape[0] <= self.weight_only_rows and not invariant:
            return torch.ops.aten._weight_int8pack_mm(
                h.to(torch.bfloat16), self.codes, self.scale_bf16).to(torch.float32)
        xq, x_scale = quantize_int8_rows(h)                                       # [n, H], [n]
        product = torch.ops.aten._int_mm(xq, self.codes_t)                        # int32
        return product.to(torch.float32).mul_(x_scale[:, None]).mul_(self.scale)

    native = __call__

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] + 6 * self.shape[0]
