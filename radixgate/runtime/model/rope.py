"""Rotary position embeddings, HF layout (``rotate_half`` over the two halves of a head)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from radixgate.runtime.model.model_config import ModelConfig


def rope_inv_freq(config: ModelConfig, freq_factors: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [head_dim / 2] inverse frequencies with the config's scaling applied.

    ``freq_factors`` (GGUF ``rope_freqs.weight``) divides the frequencies as llama.cpp does.
    """
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    inv_freq = 1.0 / (config.rope_theta ** exponents)                  # [D/2]
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        inv_freq = _llama3_scale(inv_freq, scaling)
    elif kind == "longrope":
        factors = scaling["long_factor" if scaling.get("long") else "short_factor"]
        inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32)
                          * config.rope_theta ** exponents)
    elif kind not in ("default", None):
        raise NotImplementedError(f"rope scaling {kind!r} is not supported "
                                  f"(default, linear, llama3, longrope)")
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.to(torch.float32)
    return inv_freq


def local_rope_inv_freq(config: ModelConfig) -> torch.Tensor | None:
    """The window layers' own frequencies (Gemma 3: ``rope_local_theta``, no scaling), or
    None where they share the global layers'."""
    if not config.rope_local_theta:
        return None
    plain = dataclasses.replace(config, rope_theta=config.rope_local_theta, rope_scaling=None)
    return rope_inv_freq(plain)


def rope_attention_factor(config: ModelConfig) -> float:
    """What cos and sin are multiplied by (longrope's attention factor; 1 otherwise)."""
    scaling = config.rope_scaling or {}
    return float(scaling.get("attention_factor", 1.0)) if scaling.get("rope_type") == "longrope" \
        else 1.0


def for_context(config: ModelConfig, context: int) -> ModelConfig:
    """``config`` for an engine of ``context`` positions. longrope (Phi-3) has two factor sets,
    short and long; HF switches per forward by the sequence's length, which would make K/V
    cached under one set wrong under the other. The engine picks one set for its whole life
    instead (long where the context passes the original one, as llama.cpp does by its
    context size), so every cached K/V was made with the factors that read it."""
    scaling = config.rope_scaling or {}
    if scaling.get("rope_type") != "longrope":
        return config
    long = context > int(scaling["original_max_position_embeddings"])
    return dataclasses.replace(config, rope_scaling={**scaling, "long": long})


def _llama3_scale(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths / factor, short ones kept, smooth in between."""
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


ROPE_TABLE_BLOCK = 1024      # positions a table computes at a time


class RopeTable:
    """cos and sin by position (``rope_cos_sin``'s layout: [T, 1, D], ``sin``'s first half
    negated), each position's values computed once and gathered after: a position's values
    are the same bits whatever batch it is in, whatever the thread count, in every process.
    torch's float32 ``sin`` / ``cos`` gave that no promise: they split the tensor among the
    threads, and a process's first call gave other bits in 3 of 12 runs (2 threads), which
    broke the deterministic mode's first step. The table grows a block of positions at a
    time, always the same shape through numpy's float64 sin / cos of the float32 angles,
    rounded to float32 once; ``factor`` multiplies both (``rope_attention_factor``)."""

    def __init__(self, inv_freq: torch.Tensor, factor: float = 1.0):
        self.inv_freq = inv_freq.detach().to("cpu", torch.float32).numpy()
        self.factor, self.device = factor, inv_freq.device
        dim = 2 * self.inv_freq.shape[0]
        self.cos = torch.empty(0, 1, dim, device=self.device)
        self.sin = torch.empty(0, 1, dim, device=self.device)

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype):
        if positions.numel():
            self._cover(int(positions.max()) + 1)
        cos, sin = self.cos[positions], self.sin[positions]
        return (cos, sin) if dtype == torch.float32 else (cos.to(dtype), sin.to(dtype))

    def _cover(self, count: int) -> None:
        have = self.cos.shape[0]
        if count <= have:
            return
        blocks = [self._block(start) for start in range(have, count, ROPE_TABLE_BLOCK)]
        self.cos = torch.cat([self.cos, *(c for c, _ in blocks)])
        self.sin = torch.cat([self.sin, *(s for _, s in blocks)])

    def _block(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = np.arange(start, start + ROPE_TABLE_BLOCK, dtype=np.float32)
        freqs = positions[:, None] * self.inv_freq[None, :]                 # float32 angles
        emb = np.concatenate([freqs, freqs], axis=-1)[:, None, :].astype(np.float64)
        cos, sin = np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
        if self.factor != 1.0:
            cos, sin = cos * np.float32(self.factor), sin * np.float32(self.factor)
        sin[..., :freqs.shape[-1]] *= -1
        return torch.from_numpy(cos).to(self.device), torch.from_numpy(sin).to(self.device)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
                 factor: float = 1.0):
    """positions int64 [T] -> cos, sin of shape [T, 1, D] (broadcast over heads); ``sin``'s
    first half is negated, so that ``apply_rope`` rotates with a swap of the two halves.
    ``factor`` multiplies both (``rope_attention_factor``). A one-off table: the model keeps
    a ``RopeTable`` instead."""
    return RopeTable(inv_freq, factor)(positions, dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] -> x * cos + rotate_half(x) * sin, with ``rotate_half(x) = cat(-x2, x1)``
    computed as ``cat(x2, x1) * sin`` from ``rope_cos_sin``'s sign-folded ``sin`` (3 ops)."""
    t, heads, dim = x.shape
    swapped = x.view(t, heads, 2, dim // 2).flip(2).view(t, heads, dim)   # cat(x2, x1)
    return torch.addcmul(x * cos, swapped, sin)
