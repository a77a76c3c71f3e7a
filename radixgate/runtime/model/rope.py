"""Rotary position embeddings, HF layout (``rotate_half`` over the two halves of a head)."""
from __future__ import annotations

import math

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
    elif kind not in ("default", None):
        raise NotImplementedError(f"rope scaling {kind!r} is not supported (default, linear, llama3)")
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.to(torch.float32)
    return inv_freq


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


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    """positions int64 [T] -> cos, sin of shape [T, 1, D] (broadcast over heads); ``sin``'s
    first half is negated, so that ``apply_rope`` rotates with a swap of the two halves."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]      # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]                   # [T, 1, D]
    sin = emb.sin()
    sin[..., :freqs.shape[-1]].neg_()
    return emb.cos().to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] -> x * cos + rotate_half(x) * sin, with ``rotate_half(x) = cat(-x2, x1)``
    computed as ``cat(x2, x1) * sin`` from ``rope_cos_sin``'s sign-folded ``sin`` (3 ops)."""
    t, heads, dim = x.shape
    swapped = x.view(t, heads, 2, dim // 2).flip(2).view(t, heads, dim)   # cat(x2, x1)
    return torch.addcmul(x * cos, swapped, sin)
