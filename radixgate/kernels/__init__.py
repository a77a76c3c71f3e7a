"""Paged KV-cache ops: ``store_kv``, ``paged_attention``, ``copy_blocks`` (docs/ARCHITECTURE.md section 3).

Each op dispatches by device: CUDA tensors go to a Triton kernel, anything else to the plain-torch
reference in ``reference.py`` (which is also the specification). ``backend="triton"`` /
``"reference"`` or the environment variable ``RADIXGATE_KERNEL_BACKEND`` (``auto`` by default)
overrides the choice, so tests can run the Triton kernels on the CPU under ``TRITON_INTERPRET=1``.

KV dtypes: float caches (float32 / bfloat16 / float16) run on either path (attention reads
K/V in q's dtype). 8-bit caches (int8, float8_e4m3fn, passed with their ``k_scale`` /
``v_scale``) always take the reference path, whatever the backend: the Triton kernels do not
quantize or dequantize yet (a CUDA 8-bit KV kernel is left for when a GPU can test it).

``window_attention``: the same attention with a sliding window and soft-capped scores (torch
ops on every device; Mistral's and Gemma's layers).

Importing this package imports neither Triton nor compiles anything: the Triton modules are
imported on first use.
"""
from __future__ import annotations

import os

import torch

from radixgate.kernels.reference import (
    AttentionPlan,
    dequantize_kv,
    plan_attention,
    quantize_kv,
    reference_copy_blocks,
    reference_paged_attention,
    reference_store_kv,
)
from radixgate.kernels.window_attention import window_attention

__all__ = [
    "store_kv", "paged_attention", "copy_blocks", "attention_plan", "AttentionPlan",
    "reference_store_kv", "reference_paged_attention", "reference_copy_blocks",
    "quantize_kv", "dequantize_kv", "BACKEND_ENV", "window_attention",
]

BACKEND_ENV = "RADIXGATE_KERNEL_BACKEND"
_BACKENDS = ("auto", "triton", "reference")


def _use_triton(tensor: torch.Tensor, backend: str | None, k_scale=None) -> bool:
    """Triton for CUDA tensors (or as ``backend`` / the environment says); never for an 8-bit
    cache (``k_scale`` given): those run the reference."""
    choice = backend or os.environ.get(BACKEND_ENV, "auto")
    if choice not in _BACKENDS:
        raise ValueError(f"kernel backend must be one of {_BACKENDS}, got {choice!r}")
    if k_scale is not None:
        return False
    if choice == "auto":
        return tensor.is_cuda
    return choice == "triton"


def uses_triton(tensor: torch.Tensor) -> bool:
    """The float-cache kernels for ``tensor`` run in Triton (a CUDA tensor, or the
    environment's backend says so)."""
    return _use_triton(tensor, None)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, *, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None, backend: str | None = None,
             slot_bounds: tuple[int, int] | None = None) -> None:
    """Write k, v ([T, Hkv, D]) into cache slots ``slot_mapping`` (int64 [T], -1 = skip), in
    place, rounded to the cache's dtype (quantized, scales written too, for an 8-bit cache).
    ``slot_bounds``: (lowest, highest) slot where the caller knows them (reference path)."""
    if _use_triton(k_cache, backend, k_scale):
        from radixgate.kernels.triton_kv import triton_store_kv
        return triton_store_kv(k, v, k_cache, v_cache, slot_mapping)
    return reference_store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale,
                              slot_bounds)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, cu_q_lens: torch.Tensor, seq_lens: torch.Tensor,
                    scale: float, *, plan: AttentionPlan | None = None,
                    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                    backend: str | None = None) -> torch.Tensor:
    """Causal attention of ragged queries q [T, Hq, D] over paged K/V -> [T, Hq, D].

    See ``reference_paged_attention`` for the contract. Every sequence must have q_len >= 1;
    when T == batch (one query each) the Triton path uses its decode kernel. ``plan`` (from
    ``attention_plan``) is used by the reference path and ignored by Triton. K/V are read in
    q's dtype (dequantized with ``k_scale`` / ``v_scale`` for an 8-bit cache).
    """
    if (plan is None or plan.ragged is None) and _use_triton(q, backend, k_scale):
        from radixgate.kernels.triton_attention import triton_paged_attention
        return triton_paged_attention(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens, scale)
    return reference_paged_attention(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens, scale,
                                     plan, k_scale, v_scale)


def attention_plan(block_tables: torch.Tensor, cu_q_lens: torch.Tensor, seq_lens: torch.Tensor,
                   block_size: int, num_tokens: int, *, quantized: bool = False,
                   backend: str | None = None, deterministic: bool = False) -> AttentionPlan | None:
    """Once per forward: the reference path's index work for ``paged_attention`` (every layer
    shares the tables and lengths), or None where the Triton path will run (``quantized``:
    the cache is 8-bit, so the reference runs). ``deterministic``: every sequence through
    the native fixed-order kernel, whatever the backend (``reference.RaggedPlan``)."""
    if not deterministic and _use_triton(block_tables, backend, True if quantized else None):
        return None
    return plan_attention(block_tables, cu_q_lens, seq_lens, block_size, num_tokens,
                          deterministic)


def copy_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, pairs: torch.Tensor,
                num_slots: torch.Tensor, *, k_scale: torch.Tensor | None = None,
                v_scale: torch.Tensor | None = None, backend: str | None = None) -> None:
    """Copy the first ``num_slots[i]`` slots of block ``pairs[i,0]`` to ``pairs[i,1]``, ONE
    layer (and their scales, for an 8-bit cache).

    Callers (KVCache.copy_blocks) call it once per layer. Destinations must be distinct and not
    also sources in the same call.
    """
    if _use_triton(k_cache, backend, k_scale):
        from radixgate.kernels.triton_kv import triton_copy_blocks
        return triton_copy_blocks(k_cache, v_cache, pairs, num_slots)
    return reference_copy_blocks(k_cache, v_cache, pairs, num_slots, k_scale, v_scale)
