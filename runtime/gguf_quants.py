"""Vectorised numpy dequantizers for GGML block formats (numpy only, no torch).

Each ``_dequant_<type>(blocks)`` takes ``uint8 [n_blocks, type_size]`` and returns
``float32 [n_blocks, block_elems]``. Layouts follow ggml's ``block_q*`` structs; the
scalar reference for every one is in ggml-quants.c (``dequantize_row_*``).
"""
from __future__ import annotations

import numpy as np

from gguf import GGMLQuantizationType as QT

# qtype -> (elements per block, bytes per block)
BLOCK_LAYOUT = {
    QT.F32: (1, 4), QT.F16: (1, 2), QT.BF16: (1, 2),
    QT.Q8_0: (32, 34), QT.Q4_0: (32, 18), QT.Q4_1: (32, 20),
    QT.Q5_0: (32, 22), QT.Q5_1: (32, 24),
    QT.Q4_K: (256, 144), QT.Q5_K: (256, 176), QT.Q6_K: (256, 210),
}


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 scalar at byte ``start`` of each block, as float32 [n, 1]."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8 [n, 16] -> [n, 32]: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _bits32(qh: np.ndarray) -> np.ndarray:
    """uint8 [n, 4] (a little-endian uint32) -> uint8 [n, 32] of its bits, bit i at column i."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def _dequant_f32(blocks):
    return blocks.copy().view(np.float32)


def _dequant_f16(blocks):
    return blocks.copy().view(np.float16).astype(np.float32)


def _dequant_bf16(blocks):
    return (blocks.copy().view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def _dequant_q8_0(blocks):
    return blocks[:, 2:].copy().view(np.int8).astype(np.float32) * _f16(blocks, 0)


def _dequant_q4_0(blocks):
    q = _nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)
    return q.astype(np.float32) * _f16(blocks, 0)


def _dequant_q4_1(blocks):
    return _nibbles(blocks[:, 4:]).astype(np.float32) * _f16(blocks, 0) + _f16(blocks, 2)


def _dequant_q5_0(blocks):
    q = _nibbles(blocks[:, 6:]) | (_bits32(blocks[:, 2:6]) << 4)
    return (q.astype(np.int8) - np.int8(16)).astype(np.float32) * _f16(blocks, 0)


def _dequant_q5_1(blocks):
    q = _nibbles(blocks[:, 8:]) | (_bits32(blocks[:, 4:8]) << 4)
    return q.astype(np.float32) * _f16(blocks, 0) + _f16(blocks, 2)


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed bytes of a Q4_K/Q5_K super-block -> 6-bit scales and mins, uint8 [n, 8] each."""
    lo = s[:, 0:4] & 63, s[:, 4:8] & 63
    hi_sc = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    hi_m = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return np.concatenate([lo[0], hi_sc], axis=1), np.concatenate([lo[1], hi_m], axis=1)


def _k_affine(blocks: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Apply Q4_K/Q5_K scales: q uint8 [n, 8, 32] (sub-block, element) -> float32 [n, 256]."""
    sc, mn = _k_scales_mins(blocks[:, 4:16])
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)                # [n, 1]
    scale = (d * sc.astype(np.float32))[:, :, None]            # [n, 8, 1]
    offset = (dmin * mn.astype(np.float32))[:, :, None]        # [n, 8, 1]
    return (scale * q.astype(np.float32) - offset).reshape(len(blocks), 256)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8 [n, 128] -> [n, 8, 32]: chunk c's low nibbles are sub-block 2c, high nibbles 2c+1."""
    qs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)


def _dequant_q4_k(blocks):
    return _k_affine(blocks, _k_low_nibbles(blocks[:, 16:144]))


def _dequant_q5_k(blocks):
    qh = blocks[:, 16:48]                                       # [n, 32]: bit k -> sub-block k
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1   # [n, 8, 32]
    return _k_affine(blocks, _k_low_nibbles(blocks[:, 48:176]) | (high << 4))


def _dequant_q6_k(blocks):
    n = len(blocks)
    ql = blocks[:, 0:128].reshape(n, 2, 1, 2, 32)              # half, nibble, group, l
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2).reshape(n, 2, 4, 32)
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    q = (low | (((qh >> shifts) & 3) << 4)).astype(np.int8) - np.int8(32)   # [n, 2, 4, 32]
    sc = blocks[:, 192:208].copy().view(np.int8).astype(np.float32)       # [n, 16]
    d = _f16(blocks, 208)                                                  # [n, 1]
    out = q.reshape(n, 16, 16).astype(np.float32) * (d * sc)[:, :, None]
    return out.reshape(n, 256)


_DEQUANT = {
    QT.F32: _dequant_f32, QT.F16: _dequant_f16, QT.BF16: _dequant_bf16,
    QT.Q8_0: _dequant_q8_0, QT.Q4_0: _dequant_q4_0, QT.Q4_1: _dequant_q4_1,
    QT.Q5_0: _dequant_q5_0, QT.Q5_1: _dequant_q5_1,
    QT.Q4_K: _dequant_q4_k, QT.Q5_K: _dequant_q5_k, QT.Q6_K: _dequant_q6_k,
}

SUPPORTED_TYPES = frozenset(_DEQUANT)


def dequantize(raw: np.ndarray, qtype: int, shape: tuple[int, ...]) -> np.ndarray:
    """Raw tensor bytes -> float32 array of ``shape`` (row-major, torch order: ``reversed(ne)``).

    Raises ``NotImplementedError`` for a block type we have no dequantizer for.
    """
    qtype = QT(qtype)
    if qtype not in _DEQUANT:
        raise NotImplementedError(f"GGUF tensor type {qtype.name} is not supported; "
                                  f"supported: {sorted(t.name for t in _DEQUANT)}")
    block_elems, type_size = BLOCK_LAYOUT[qtype]
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, type_size)
    out = _DEQUANT[qtype](blocks).reshape(-1)
    count = int(np.prod(shape))
    if out.size != count:
        raise ValueError(f"{qtype.name}: {out.size} values for shape {shape}")
    return out.reshape(shape)
