"""Paged KV-cache ops: ``store_kv``, ``paged_attention``, ``copy_blocks`` (DESIGN.md section 5).

Each op dispatches by device: CUDA tensors go to a Triton kernel, anything else to the plain-torch
reference in ``reference.py`` (which is also the specification). ``backend="triton"`` /
``"reference"`` or the environment variable ``RADIXGATE_KERNEL_BACKEND`` (``auto`` by default)
overrides the choice, so tests can run the Triton kernels on the CPU under ``TRITON_INTERPRET=1``.

Importing this package imports neither Triton nor compiles anything: the Triton modules are
imported on first use.
"""
from __future__ import annotations

import os

import torch

from radixgate.kernels.reference import (
    AttentionPlan,
    plan_attention,
    reference_copy_blocks,
    reference_paged_attention,
    reference_store_kv,
)

__all__ = [
    "store_kv", "paged_attention", "copy_blocks", "attention_plan", "AttentionPlan",
    "reference_store_kv", "reference_paged_attention", "reference_copy_blocks",
    "BACKEND_ENV",
]

BACKEND_ENV = "RADIXGATE_KERNEL_BACKEND"
_BACKENDS = ("auto", "triton", "reference")


def _use_triton(tensor: torch.Tensor, backend: str | None) -> bool:
    choice = backend or os.environ.get(BACKEND_ENV, "auto")
    if choice not in _BACKENDS:
        raise ValueError(f"kernel backend must be one of {_BACKENDS}, got {choice!r}")
    if choice == "auto":
        return tensor.is_cuda
    return choice == "triton"


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, *, backend: str | None = None) -> None:
    """Write k, v ([T, Hkv, D]) into cache slots ``slot_mapping`` (int64 [T], -1 = skip), in place."""
    if _use_triton(k_cache, backend):
        from radixgate.kernels.triton_kv import triton_store_kv
        return triton_store_kv(k, v, k_cache, v_cache, slot_mapping)
    return reference_store_kv(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    block_tables: torch.Tensor, cu_q_lens: torch.Tensor, seq_lens: torch.Tensor,
                    scale: float, *, plan: AttentionPlan | None = None,
                    backend: str | None = None) -> torch.Tensor:
    """Causal attention of ragged queries q [T, Hq, D] over paged K/V -> [T, Hq, D].

    See ``reference_paged_attention`` for the contract. Every sequence must have q_len >= 1;
    when T == batch (one query each) the Triton path uses its decode kernel. ``plan`` (from
    ``attention_plan``) is used by the reference path and ignored by Triton.
    """
    if _use_triton(q, backend):
        from radixgate.kernels.triton_attention import triton_paged_attention
        return triton_paged_attention(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens, scale)
    return reference_paged_attention(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens, scale,
                                     plan)


def attention_plan(block_tables: torch.Tensor, cu_q_lens: torch.Tensor, seq_lens: torch.Tensor,
                   block_size: int, num_tokens: int, *,
                   backend: str | None = None) -> AttentionPlan | None:
    """Once per forward: the reference path's index work for ``paged_attention`` (every layer
    shares the tables and lengths), or None where the Triton path will run."""
    if _use_triton(block_tables, backend):
        return None
    return plan_attention(block_tables, cu_q_lens, seq_lens, block_size, num_tokens)


def copy_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, pairs: torch.Tensor,
                num_slots: torch.Tensor, *, backend: str | None = None) -> None:
    """Copy the first ``num_slots[i]`` slots of block ``pairs[i,0]`` to ``pairs[i,1]``, ONE layer.

    Callers (KVCache.copy_blocks) call it once per layer. Destinations must be distinct and not
    also sources in the same call.
    """
    if _use_triton(k_cache, backend):
        from radixgate.kernels.triton_kv import triton_copy_blocks
        return triton_copy_blocks(k_cache, v_cache, pairs, num_slots)
    return reference_copy_blocks(k_cache, v_cache, pairs, num_slots)
