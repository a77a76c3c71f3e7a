"""Preallocated paged KV memory: per layer ``k[layer]``, ``v[layer]`` of shape
``[num_blocks, block_size, Hkv, D]`` (views into one tensor per K and V)."""
from __future__ import annotations

import logging

import torch

from radixgate.kernels import copy_blocks as _copy_blocks

log = logging.getLogger(__name__)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x bytes per number."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


class KVCache:
    """Owns the K/V tensors; block bookkeeping lives in ``radix_cache.BlockPool``."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self._k = torch.zeros(shape, dtype=dtype, device=self.device)
        self._v = torch.zeros(shape, dtype=dtype, device=self.device)
        self.k = list(self._k.unbind(0))      # [num_blocks, block_size, Hkv, D] per layer
        self.v = list(self._v.unbind(0))

    @property
    def num_tokens(self) -> int:
        """How many token positions fit."""
        return self.num_blocks * self.block_size

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim,
                                  self._k.element_size())

    @property
    def nbytes(self) -> int:
        return self._k.nbytes + self._v.nbytes

    @staticmethod
    def blocks_for_budget(budget_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int,
                          block_size: int, dtype_bytes: int) -> int:
        """``budget // (bytes_per_token * block_size)``."""
        per_block = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes) * block_size
        return int(budget_bytes) // per_block

    @classmethod
    def from_budget(cls, config, budget_bytes: int, block_size: int = 16,
                    dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> "KVCache":
        """Allocate as many blocks as ``budget_bytes`` holds for ``config`` (a ModelConfig);
        logs bytes per token and how many tokens fit."""
        dtype_bytes = torch.empty((), dtype=dtype).element_size()
        num_blocks = cls.blocks_for_budget(budget_bytes, config.num_layers, config.num_kv_heads,
                                           config.head_dim, block_size, dtype_bytes)
        if num_blocks < 1:
            raise ValueError(f"KV budget of {budget_bytes} bytes holds no block of {block_size} tokens")
        cache = cls(config.num_layers, num_blocks, block_size, config.num_kv_heads,
                    config.head_dim, dtype, device)
        log.info("KV cache: %d bytes/token (%s), %d blocks x %d = %d tokens in %.2f GiB",
                 cache.bytes_per_token, dtype, num_blocks, block_size, cache.num_tokens,
                 cache.nbytes / 2**30)
        return cache

    def copy_blocks(self, pairs: torch.Tensor, num_slots: torch.Tensor) -> None:
        """Copy-on-write: for every layer, slots ``[0, num_slots[i])`` of block ``pairs[i, 0]``
        into block ``pairs[i, 1]`` (pairs int64 [n, 2], num_slots int32 [n])."""
        pairs = pairs.to(self.device, torch.int64)
        num_slots = num_slots.to(self.device, torch.int32)
        for k_cache, v_cache in zip(self.k, self.v):
            _copy_blocks(k_cache, v_cache, pairs, num_slots)
