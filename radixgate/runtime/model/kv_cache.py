"""Paged KV memory: per layer ``k[layer]``, ``v[layer]`` of shape
``[num_blocks, block_size, Hkv, D]`` (views into one tensor per K and V), in the KV dtype.

KV dtypes (``[cache] kv_dtype``): ``float32``, ``bfloat16``, ``float16`` store the numbers as
they are (rounded to the dtype); ``int8`` and ``fp8`` (e4m3) store 8-bit codes plus one
float16 scale per (token, kv head) in ``k_scale[layer]`` / ``v_scale[layer]``
(``[num_blocks, block_size, Hkv]``; None for the float dtypes): ``store_kv`` quantizes on
write and ``paged_attention`` dequantizes what it reads (radixgate/kernels/reference.py). ``auto``:
the model's dtype (``resolve_kv_dtype`` says why not bfloat16).

Lazy: on the CPU the tensors are anonymous memory maps, so a page becomes resident only when
a block on it is first written; the block pool hands out low block ids first and reuses freed
blocks first (radixgate/radix_cache/pool.py), so the resident part grows from block 0 with the most
blocks ever held at once, and an idle server holds its weights, not its KV budget.
"""
from __future__ import annotations

import logging
import math
import mmap

import torch

from radixgate.kernels import copy_blocks as _copy_blocks
from radixgate.radix_cache.kv_dtypes import QUANTIZED_KV_DTYPES, kv_bytes_per_token
from radixgate.runtime.model.kv_dtypes import KV_DTYPE_NAMES, KV_TORCH_DTYPES, SCALE_DTYPE

log = logging.getLogger(__name__)


def resolve_kv_dtype(requested: str, model_dtype: torch.dtype, device: str | torch.device) -> str:
    """The KV dtype to allocate: ``requested`` itself, or for ``auto`` the model's dtype.

    Not bfloat16 on the CPU although its accuracy against float32 KV holds (SmolLM2-135M, 512
    tokens: top-1 agreement 0.992, mean KL 3e-4; benchmarks/kv_accuracy.py): with the prefix
    cache on and off, fp32 matmul rounding over other row counts flips stored bf16 values and
    logits then differ by up to 0.1 (float32 KV: ~1e-4), beyond the greedy tests' 1e-3
    tolerance, so bfloat16 stays an explicit choice. ``device`` is for a future per-device rule.
    """
    if requested != "auto":
        if requested not in KV_TORCH_DTYPES:
            raise ValueError(f"kv dtype must be auto or one of {', '.join(KV_TORCH_DTYPES)}, "
                             f"got {requested!r}")
        return requested
    return KV_DTYPE_NAMES.get(model_dtype, "float32")


def kv_dtype_name(dtype: torch.dtype | str) -> str:
    """``"int8"`` for ``"int8"`` or ``torch.int8`` (the names of ``[cache] kv_dtype``)."""
    name = dtype if isinstance(dtype, str) else KV_DTYPE_NAMES.get(dtype)
    if name not in KV_TORCH_DTYPES:
        raise ValueError(f"unsupported KV dtype {dtype!r}: one of {', '.join(KV_TORCH_DTYPES)}")
    return name


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros that take no memory until written: on the CPU an anonymous private mapping (the
    kernel hands out zero pages on first touch; nothing is filled here), elsewhere
    ``torch.zeros``. The tensor keeps the mapping alive."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    area = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(area, dtype=torch.uint8).view(dtype).view(shape)


class KVCache:
    """Owns the K/V tensors (and the 8-bit dtypes' scales); block bookkeeping lives in
    ``radix_cache.BlockPool``. ``dtype``: a torch dtype or a ``[cache] kv_dtype`` name."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype | str = torch.float32,
                 device: str | torch.device = "cpu"):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.kv_dtype = kv_dtype_name(dtype)
        self.dtype, self.device = KV_TORCH_DTYPES[self.kv_dtype], torch.device(device)
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self._tensors = [lazy_zeros(shape, self.dtype, self.device) for _ in "kv"]
        self.k = list(self._tensors[0].unbind(0))      # [num_blocks, block_size, Hkv, D] per layer
        self.v = list(self._tensors[1].unbind(0))
        self.k_scale = self.v_scale = [None] * num_layers
        if self.quantized:
            scales = [lazy_zeros(shape[:-1], SCALE_DTYPE, self.device) for _ in "kv"]
            self._tensors += scales
            self.k_scale = list(scales[0].unbind(0))   # [num_blocks, block_size, Hkv] per layer
            self.v_scale = list(scales[1].unbind(0))

    @property
    def quantized(self) -> bool:
        return self.kv_dtype in QUANTIZED_KV_DTYPES

    @property
    def num_tokens(self) -> int:
        """How many token positions fit."""
        return self.num_blocks * self.block_size

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.kv_dtype)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._tensors)

    def layer_scales(self, layer: int) -> dict:
        """``k_scale`` / ``v_scale`` keywords of the kernels for one layer (None: float KV)."""
        return {"k_scale": self.k_scale[layer], "v_scale": self.v_scale[layer]}

    @staticmethod
    def blocks_for_budget(budget_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int,
                          block_size: int, dtype_bytes: int | str) -> int:
        """``budget // (bytes_per_token * block_size)`` (``dtype_bytes``: bytes or a dtype name)."""
        per_block = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes) * block_size
        return int(budget_bytes) // per_block

    @classmethod
    def from_budget(cls, config, budget_bytes: int, block_size: int = 16,
                    dtype: torch.dtype | str = torch.float32,
                    device: str | torch.device = "cpu") -> "KVCache":
        """As many blocks as ``budget_bytes`` holds for ``config`` (a ModelConfig) in ``dtype``
        (scales included); logs bytes per token and how many tokens fit."""
        name = kv_dtype_name(dtype)
        num_blocks = cls.blocks_for_budget(budget_bytes, config.num_layers, config.num_kv_heads,
                                           config.head_dim, block_size, name)
        if num_blocks < 1:
            raise ValueError(f"KV budget of {budget_bytes} bytes holds no block of {block_size} tokens")
        cache = cls(config.num_layers, num_blocks, block_size, config.num_kv_heads,
                    config.head_dim, name, device)
        log.info("KV cache: %d bytes/token (%s), %d blocks x %d = %d tokens in %.2f GiB (lazy)",
                 cache.bytes_per_token, name, num_blocks, block_size, cache.num_tokens,
                 cache.nbytes / 2**30)
        return cache

    def copy_blocks(self, pairs: torch.Tensor, num_slots: torch.Tensor) -> None:
        """Copy-on-write: for every layer, slots ``[0, num_slots[i])`` of block ``pairs[i, 0]``
        into block ``pairs[i, 1]`` (pairs int64 [n, 2], num_slots int32 [n]), scales included."""
        pairs = pairs.to(self.device, torch.int64)
        num_slots = num_slots.to(self.device, torch.int32)
        for layer, (k_cache, v_cache) in enumerate(zip(self.k, self.v)):
            _copy_blocks(k_cache, v_cache, pairs, num_slots, **self.layer_scales(layer))

    # -- whole blocks as bytes (the KV tiers below memory: radixgate/runtime/kv_tier/) ----------------
    def block_parts(self) -> list[torch.Tensor]:
        """K, V (and the 8-bit dtypes' scales) as bytes, each ``[layers, num_blocks,
        block_size, bytes per slot]`` (views: writing them writes the cache)."""
        return [t.view(torch.uint8).view(t.shape[0], t.shape[1], t.shape[2], -1)
                for t in self._tensors]

    def slot_bytes(self) -> list[int]:
        """Bytes per (layer, slot) of each of ``block_parts``."""
        return [part.shape[-1] for part in self.block_parts()]

    def gather_blocks(self, blocks: list[int]) -> list[torch.Tensor]:
        """A copy of ``blocks`` on the CPU, each part ``[len(blocks), layers, block_size,
        bytes per slot]`` (contiguous: ``part[i]`` is block ``blocks[i]``'s bytes)."""
        index = torch.tensor(blocks, dtype=torch.int64, device=self.device)
        return [part.index_select(1, index).transpose(0, 1).contiguous().cpu()
                for part in self.block_parts()]

    def write_block(self, block: int, parts: list[torch.Tensor], num_slots: int) -> None:
        """Slots ``[0, num_slots)`` of ``block`` in every layer from ``parts`` (uint8,
        ``[layers, num_slots, bytes per slot]`` each, ``block_parts`` order)."""
        for dest, src in zip(self.block_parts(), parts):
            if dest.device.type == "cpu":
                # numpy, not torch: this runs on the tier's reader thread, and a torch copy
                # this large goes parallel and gives that thread an OpenMP pool of its own
                # (radixgate/runtime/engine/cpu_threads.py: the engine's workers then sleep between ops).
                dest.numpy()[:, block, :num_slots] = src.numpy()
            else:
                dest[:, block, :num_slots].copy_(src)
