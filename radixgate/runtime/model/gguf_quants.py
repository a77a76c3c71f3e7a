"""GGML block formats: dequantization (``gguf.quants``) and the integer codes of the 32-value
block formats, for computing with them without dequantizing (numpy only, no torch).

``dequantize`` delegates to the ``gguf`` package's ``gguf.quants.dequantize``: bit for bit what
our own numpy dequantizers gave, and as fast on the default model's tensors (Q4_1 ffn_gate:
4.3-6.1 ms ours against 5.1-8.6 ms; Q8_0 token_embd: 50-290 ms against 37-270 ms, the spread
being page faults of the memory-mapped file), so the hand-written ones are gone.

``group_codes`` gives the codes and per-block scales of Q8_0 / Q4_0 / Q4_1 (32 values a block,
fp16 scale, Q4_1 also an fp16 minimum) in tinygemm's convention ``w = (q - 8) * scale + zero``
for the 4-bit types; layouts follow ggml's ``block_q*`` structs (ggml-quants.c).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QT
from gguf import quants

GROUP = 32                                  # values per Q8_0 / Q4_0 / Q4_1 block
FOUR_BIT_TYPES = frozenset({QT.Q4_0, QT.Q4_1})
EIGHT_BIT_TYPES = frozenset({QT.Q8_0})
FLOAT_TYPES = frozenset({QT.F32, QT.F16, QT.BF16})

SUPPORTED_TYPES = frozenset({
    QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1,
    QT.Q4_K, QT.Q5_K, QT.Q6_K})
# qtype -> (elements per block, bytes per block)
BLOCK_LAYOUT = {qtype: GGML_QUANT_SIZES[qtype] for qtype in SUPPORTED_TYPES}


def dequantize(raw: np.ndarray, qtype: int, shape: tuple[int, ...]) -> np.ndarray:
    """Raw tensor bytes -> float32 array of ``shape`` (row-major, torch order: ``reversed(ne)``).

    Raises ``NotImplementedError`` for a block type we have no dequantizer for.
    """
    qtype = QT(qtype)
    if qtype not in SUPPORTED_TYPES:
        raise NotImplementedError(f"GGUF tensor type {qtype.name} is not supported; "
                                  f"supported: {sorted(t.name for t in SUPPORTED_TYPES)}")
    out = quants.dequantize(np.asarray(raw).view(np.uint8).reshape(-1), qtype)
    out = np.asarray(out, dtype=np.float32).reshape(-1)
    count = int(np.prod(shape))
    if out.size != count:
        raise ValueError(f"{qtype.name}: {out.size} values for shape {shape}")
    return out.reshape(shape)


class GroupCodes(NamedTuple):
    """A [N, K] tensor as codes [N, K] and per-32-value-group scale / zero [N, K / 32] (float32).

    Q8_0: ``codes`` int8, ``w = codes * scale`` (``zero`` is None).
    Q4_0 / Q4_1: ``codes`` uint8 in 0..15, ``w = (codes - 8) * scale + zero``.
    """
    codes: np.ndarray
    scale: np.ndarray
    zero: np.ndarray | None


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 scalar at byte ``start`` of each block [n, bytes], as float32 [n]."""
    return blocks[:, start:start + 2].copy().view(np.float16)[:, 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8 [n, 16] -> [n, 32]: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def group_codes(raw: np.ndarray, qtype: int, shape: tuple[int, int]) -> GroupCodes:
    """Codes and scales of a Q8_0 / Q4_0 / Q4_1 tensor of ``shape`` [N, K] (K % 32 == 0)."""
    qtype = QT(qtype)
    rows, cols = shape
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = np.asarray(raw).view(np.uint8).reshape(-1, type_size)     # [N * K/32, bytes]
    groups = (rows, cols // GROUP)
    scale = _f16(blocks, 0).reshape(groups)
    if qtype == QT.Q8_0:
        return GroupCodes(blocks[:, 2:].view(np.int8).reshape(rows, cols), scale, None)
    if qtype == QT.Q4_0:
        codes, zero = _nibbles(blocks[:, 2:]), np.zeros(groups, np.float32)
    elif qtype == QT.Q4_1:                  # q d + m == (q - 8) d + (m + 8 d)
        codes, zero = _nibbles(blocks[:, 4:]), _f16(blocks, 2).reshape(groups) + 8 * scale
    else:
        raise NotImplementedError(f"no integer codes for {qtype.name}")
    return GroupCodes(codes.reshape(rows, cols), scale, zero)
