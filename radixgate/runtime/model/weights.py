"""Build the model's matmuls and its embedding lookup from loaded weights, in the weights dtype
that ``linear.resolve_weights_dtype`` chose, keeping one copy of each weight.

A weight source is a torch tensor (HF directories, ``--tiny``) or a ``GGUFWeight`` left in the
memory-mapped file (duck-typed here: ``shape``, ``qtype``, ``dense()``, ``group_codes()``,
``rows(ids)``). Q4_0 / Q4_1 sources become int4 from their own codes; every other source or
dtype is read dense (float32), one tensor at a time, and converted.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from radixgate.kernels import native
from radixgate.runtime.model.gguf_quants import EIGHT_BIT_TYPES, FOUR_BIT_TYPES
from radixgate.runtime.model.head import RescoredHead, int_mm_available
from radixgate.runtime.model.linear import (DenseLinear, Int4Linear, Int8Linear, Linear,
                                      has_bf16_gemm, quantize_int4_groups, quantize_int8_rows)


def source_kind(sources) -> str:
    """``"4bit"``, ``"8bit"`` or ``"float"``: how the model's matmul weights are stored."""
    qtypes = {getattr(s, "qtype", None) for s in sources}
    if qtypes & FOUR_BIT_TYPES:
        return "4bit"
    return "8bit" if qtypes & EIGHT_BIT_TYPES else "float"


def dense(source) -> torch.Tensor:
    """float32 [N, K] (a tensor source as it is, cast)."""
    if isinstance(source, torch.Tensor):
        return source.float()
    return torch.from_numpy(source.dense())


def _fixed_from_blocks(parts, device: torch.device):
    """GGUF Q4_0 / Q4_1 parts straight into the fixed int4 layout where the layer would keep
    it (``Int4Linear``: CPU, the kernel built), else None: 0.02 s for the default model's
    120 matmuls against ~0.5 s through codes (start to healthy)."""
    if torch.device(device).type != "cpu" or not native.has_int4_fixed():
        return None
    blocks = [getattr(part, "q4_blocks", lambda: None)() for part in parts]
    if any(b is None for b in blocks):
        return None
    return native.int4_fixed_from_q4(blocks, [b.shape[2] == 20 for b in blocks])


def _int4_parts(parts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes, scale, zero of each part, exact from Q4_0/Q4_1 blocks, else quantized."""
    codes, scales, zeros = [], [], []
    for part in parts:
        if getattr(part, "qtype", None) in FOUR_BIT_TYPES:
            c, s, z = (torch.from_numpy(np.ascontiguousarray(a)) for a in part.group_codes())
        else:
            c, s, z = quantize_int4_groups(dense(part))
        codes.append(c), scales.append(s), zeros.append(z)
    return torch.cat(codes), torch.cat(scales), torch.cat(zeros)


def build_linear(parts, weights_dtype: str, device: torch.device,
                 bias: torch.Tensor | None = None) -> Linear:
    """One matmul over ``parts`` stacked along the output rows (q/k/v, gate/up)."""
    if weights_dtype == "int4":
        fixed = _fixed_from_blocks(parts, device)
        if fixed is not None:
            return Int4Linear.from_fixed(fixed, bias)
        return Int4Linear(*_int4_parts(parts), bias)
    weight = torch.cat([dense(p) for p in parts])                        # [N, K] fp32
    if weights_dtype == "int8":
        return Int8Linear(*quantize_int8_rows(weight), bias)
    return DenseLinear(weight.to(device=device, dtype=getattr(torch, weights_dtype)), bias)


def head_dtype(weights_dtype: str) -> str:
    """The output head's dtype: int4 heads lose too much of the logits, so an int4 model keeps
    its head in bf16 or float32 without AVX512-BF16 (a GGUF file's head: ``RescoredHead``)."""
    if weights_dtype != "int4":
        return weights_dtype
    return "bfloat16" if has_bf16_gemm() else "float32"


class TableEmbedding:
    """Rows of a dense table [V, H]; the table may double as a tied head's weight."""

    def __init__(self, table: torch.Tensor, dtype: torch.dtype):
        self.table, self.dtype, self.shape = table, dtype, tuple(table.shape)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table[ids].to(self.dtype)                            # [T, H]


class FileEmbedding:
    """Rows read from the memory-mapped GGUF and dequantized per lookup: the file is the
    table's only copy, and only rows in use are paged in."""

    def __init__(self, source, device: torch.device, dtype: torch.dtype):
        self.source, self.device, self.dtype = source, device, dtype
        self.shape = tuple(source.shape)
        blocks = getattr(source, "q8_0_blocks", lambda: None)()
        self.blocks = None if blocks is None else tuple(map(_file_view, blocks))

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.blocks is not None:        # Q8_0 in torch: a few ops, not numpy's many
            codes, scales = self.blocks
            ids = ids.cpu()
            rows = (codes[ids].to(torch.float32) * scales[ids].to(torch.float32))
            return rows.view(len(ids), self.shape[1]).to(device=self.device, dtype=self.dtype)
        rows = self.source.rows(ids.cpu().numpy())                       # [T, H] fp32
        return torch.from_numpy(rows).to(device=self.device, dtype=self.dtype)


def _file_view(array: np.ndarray) -> torch.Tensor:
    """A torch view of a read-only memory-mapped array (only ever read)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)       # "not writable": we only read
        return torch.from_numpy(array)


def build_embedding_and_head(embed, head, weights_dtype: str, device: torch.device,
                             dtype: torch.dtype):
    """(embedding, head): ``head`` None means tied to ``embed``. A GGUF table on the CPU stays
    in the file; a dense table shared with a tied head is kept once, unpacked."""
    out_dtype = head_dtype(weights_dtype)
    if not isinstance(embed, torch.Tensor) and device.type == "cpu":
        embedding = FileEmbedding(embed, device, dtype)
        source = head if head is not None else embed
        if weights_dtype == "int4" and not isinstance(source, torch.Tensor) and int_mm_available():
            rows = embedding if head is None else FileEmbedding(head, device, torch.float32)
            if rows.blocks is not None:
                return embedding, RescoredHead.from_blocks(*rows.blocks, rows)
            return embedding, RescoredHead.from_weight(dense(source), rows)
        return embedding, build_linear([source], out_dtype, device)
    table_dtype = getattr(torch, out_dtype) if out_dtype in ("float32", "bfloat16") else dtype
    table = dense(embed).to(device=device, dtype=table_dtype).contiguous()
    embedding = TableEmbedding(table, dtype)
    if head is None:
        return embedding, DenseLinear(table, pack=False)
    return embedding, build_linear([head], out_dtype, device)
