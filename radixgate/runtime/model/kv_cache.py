"""Paged KV memory: per layer ``k[layer]``, ``v[layer]`` of shape
``[num_blocks, block_size, Hkv, D]`` (views into one tensor per K and V), in the KV dtype.

KV dtypes (``[cache] kv_dtype``): ``float32``, ``bfloat16``, ``float16`` store the numbers as
they are (rounded to the dtype); ``int8`` and ``fp8`` (e4m3) store 8-bit codes plus one
float16 scale per (token, kv head) in ``k_scale[layer]`` / ``v_scale[layer]``
(``[num_blocks, block_size, Hkv]``; None for the float dtypes): ``store_kv`` quantizes on
write and ``paged_attention`` dequantizes what it reads (radixgate/kernels/reference.py). ``auto``:
int8 in the deterministic mode on the CPU, else the model's dtype (``resolve_kv_dtype``).

Lazy: on the CPU the tensors are anonymous memory maps, so a page becomes resident only when
a block on it is first written; the block pool hands out low block ids first and reuses freed
blocks first (radixgate/kv/core/pool.py), so the resident part grows from block 0 with the most
blocks ever held at once, and an idle server holds its weights, not its KV budget.
"""
from __future__ import annotations

import logging
import math
import mmap

import torch

from radixgate.kernels import copy_blocks as _copy_blocks
from radixgate.kv.dtypes import QUANTIZED_KV_DTYPES, kv_bytes_per_token
from radixgate.kv.groups.window_plan import PoolSplit, split_pool
from radixgate.kv.groups.window_slots import WindowSlots
from radixgate.runtime.model.kv_dtypes import KV_DTYPE_NAMES, KV_TORCH_DTYPES, SCALE_DTYPE

log = logging.getLogger(__name__)


def resolve_kv_dtype(requested: str, model_dtype: torch.dtype, device: str | torch.device,
                     deterministic: bool = False) -> str:
    """The KV dtype to allocate: ``requested`` itself, or for ``auto``: ``int8`` where the
    deterministic mode runs on the CPU over a float32 model, else the model's dtype.

    int8, chosen by measurement (benchmarks/RESULTS.md, issue 49, SmolLM2-135M, 2 vCPUs):
    3.88x float32's tokens in the same budget (the multi-turn workload's hit rate at 5% of its
    working set 38.6%, at 25% 81%: capacity is hit rate), answers' top-1 agreement with
    float32 KV 0.982 over 200 chat prompts (bfloat16 0.991 at 2x, fp8 0.960 at 3.88x), and the
    fastest long-context decode (4k context: 20.0 ms a step against float32's 31.2; the
    native attention reads the codes in place). Only in the deterministic mode: there a
    token's K/V are the same bits however it was scheduled, so its codes are too and answers
    stay the same with the cache on and off; elsewhere matmul rounding over other row counts
    flips stored values (as it does for bfloat16: with the prefix cache on and off logits
    then differ by up to 0.1, float32 KV ~1e-4). ``device`` and ``model_dtype``: a GPU or a
    low-precision model keeps the model's dtype.
    """
    if requested != "auto":
        if requested not in KV_TORCH_DTYPES:
            raise ValueError(f"kv dtype must be auto or one of {', '.join(KV_TORCH_DTYPES)}, "
                             f"got {requested!r}")
        return requested
    if deterministic and torch.device(device).type == "cpu" and model_dtype == torch.float32:
        return "int8"
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
    ``kv.BlockPool``. ``dtype``: a torch dtype or a ``[cache] kv_dtype`` name."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype | str = torch.float32,
                 device: str | torch.device = "cpu", split: PoolSplit | None = None):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.kv_dtype = kv_dtype_name(dtype)
        self.dtype, self.device = KV_TORCH_DTYPES[self.kv_dtype], torch.device(device)
        pooled = split is not None and split.pooled
        self.window_layers = frozenset(split.window_layers) if pooled else frozenset()
        # the window pool (kv.WindowSlots) and its map as a tensor (shared memory)
        self.window = WindowSlots(num_blocks, split.window_blocks, block_size, split.window) \
            if pooled else None
        self.window_index = torch.frombuffer(self.window.index, dtype=torch.int32) \
            if pooled else None
        groups = [[i for i in range(num_layers) if i not in self.window_layers]]
        counts = [num_blocks]
        if pooled:
            groups.append(sorted(self.window_layers))
            counts.append(split.window_blocks + 1)       # + the trash block (WindowSlots.trash)
        self._tensors, self._part_layers = [], []
        self.k, self.v = [None] * num_layers, [None] * num_layers
        self.k_scale, self.v_scale = [None] * num_layers, [None] * num_layers
        for layers, count in zip(groups, counts):
            self._add_group(layers, count)

    def _add_group(self, layers: list[int], count: int) -> None:
        """K and V (and the 8-bit dtypes' scales) of ``layers`` over ``count`` blocks (none
        for no layers: a model whose every layer has a window keeps no main-pool bytes)."""
        if not layers:
            return
        shape = (len(layers), count, self.block_size, self.num_kv_heads, self.head_dim)
        k, v = (lazy_zeros(shape, self.dtype, self.device) for _ in "kv")
        parts = [k, v]
        for j, layer in enumerate(layers):
            self.k[layer], self.v[layer] = k[j], v[j]   # [count, block_size, Hkv, D] each
        if self.quantized:
            ks, vs = (lazy_zeros(shape[:-1], SCALE_DTYPE, self.device) for _ in "kv")
            parts += [ks, vs]
            for j, layer in enumerate(layers):
                self.k_scale[layer], self.v_scale[layer] = ks[j], vs[j]
        self._tensors += parts
        self._part_layers += [layers] * len(parts)

    @property
    def num_window_blocks(self) -> int:
        return 0 if self.window is None else self.window.pool.num_blocks

    def window_view(self, block_tables: torch.Tensor,
                    slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Main block tables and slots (-1 kept) as the window layers' (through
        ``window_index``: a tombstone reads the trash block, which nothing in a window reads)."""
        index, B = self.index_tensor(), self.block_size
        tables = torch.where(block_tables >= 0, index[block_tables.clamp(min=0).long()],
                             -1).to(torch.int32)
        blocks = slot_mapping.clamp(min=0) // B
        slots = torch.where(slot_mapping >= 0, index[blocks].long() * B + slot_mapping % B, -1)
        return tables, slots

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
                    device: str | torch.device = "cpu", *, context: int = 0,
                    step_tokens: int = 0, window_ratio: float = 0.0) -> "KVCache":
        """As many blocks as ``budget_bytes`` holds for ``config`` (a ModelConfig) in ``dtype``
        (scales included), split with a window pool where the model's window layers allow
        (``kv.groups.window_plan.split_pool``: ``context`` tokens, ``step_tokens`` a step,
        ``window_ratio`` 0 auto); logs bytes per token and how many tokens fit."""
        name = kv_dtype_name(dtype)
        layer_block = kv_bytes_per_token(1, config.num_kv_heads, config.head_dim, name) * block_size
        split = split_pool(int(budget_bytes), layer_block, config.num_layers,
                           config.layer_windows if context else (), block_size=block_size,
                           context=context, step_tokens=step_tokens, ratio=window_ratio)
        if split.main_blocks < 1:
            raise ValueError(f"KV budget of {budget_bytes} bytes holds no block of {block_size} tokens")
        cache = cls(config.num_layers, split.main_blocks, block_size, config.num_kv_heads,
                    config.head_dim, name, device, split)
        log.info("KV cache: %d bytes/token (%s), %d blocks x %d = %d tokens in %.2f GiB (lazy)%s",
                 cache.bytes_per_token, name, split.main_blocks, block_size, cache.num_tokens,
                 cache.nbytes / 2**30, f"; window layers: {split.window_blocks} blocks "
                 f"(W={split.window})" if split.pooled else "")
        return cache

    def copy_blocks(self, pairs: torch.Tensor, num_slots: torch.Tensor) -> None:
        """Copy-on-write: for every layer, slots ``[0, num_slots[i])`` of block ``pairs[i, 0]``
        into block ``pairs[i, 1]`` (pairs int64 [n, 2], num_slots int32 [n]), scales included;
        the window layers between the blocks' window ids (both must have one)."""
        pairs = pairs.to(self.device, torch.int64)
        num_slots = num_slots.to(self.device, torch.int32)
        window_pairs = None
        if self.window is not None:
            window_pairs = self.index_tensor()[pairs].long()
        for layer, (k_cache, v_cache) in enumerate(zip(self.k, self.v)):
            which = window_pairs if layer in self.window_layers else pairs
            _copy_blocks(k_cache, v_cache, which, num_slots, **self.layer_scales(layer))

    def index_tensor(self) -> torch.Tensor:
        """``window_index`` as it is now on the cache's device (the CPU's shares memory with
        the map; another device gets a fresh copy)."""
        if self.device.type == "cpu":
            return self.window_index
        return torch.frombuffer(self.window.index, dtype=torch.int32).to(self.device)

    # -- whole blocks as bytes (the KV tiers below memory: radixgate/kv/tiers/disk/) ----------------
    def block_parts(self) -> list[torch.Tensor]:
        """K, V (and the 8-bit dtypes' scales) as bytes, each ``[layers, blocks, block_size,
        bytes per slot]`` (views: writing them writes the cache): the main pool's parts, then
        the window pool's (indexed by window id) when there is one."""
        return [t.view(torch.uint8).view(t.shape[0], t.shape[1], t.shape[2], -1)
                for t in self._tensors]

    def slot_bytes(self) -> list[int]:
        """Bytes per (layer, slot) of each of ``block_parts``."""
        return [part.shape[-1] for part in self.block_parts()]

    def part_layers(self) -> list[int]:
        """How many layers each of ``block_parts`` holds."""
        return [len(layers) for layers in self._part_layers]

    def _is_window_part(self, layers: list[int]) -> bool:
        return bool(layers) and layers[0] in self.window_layers

    def _part_ids(self, blocks: list[int]) -> list[list[int]]:
        """Per part, the ids ``blocks`` have in it (window ids in the window pool's parts: a
        tombstone gives the trash block, zeros)."""
        window = [self.window.window_id(b) for b in blocks] if self.window is not None else None
        return [window if self._is_window_part(layers) else blocks
                for layers in self._part_layers]

    def gather_blocks(self, blocks: list[int]) -> list[torch.Tensor]:
        """A copy of ``blocks`` on the CPU, each part ``[len(blocks), layers, block_size,
        bytes per slot]`` (contiguous: ``part[i]`` is block ``blocks[i]``'s bytes)."""
        return [part.index_select(1, torch.tensor(ids, dtype=torch.int64, device=self.device))
                .transpose(0, 1).contiguous().cpu()
                for part, ids in zip(self.block_parts(), self._part_ids(blocks))]

    def write_block(self, block: int, parts: list[torch.Tensor], num_slots: int) -> None:
        """Slots ``[0, num_slots)`` of ``block`` in every layer from ``parts`` (uint8,
        ``[layers, num_slots, bytes per slot]`` each, ``block_parts`` order); the window
        layers' parts only when ``block`` has a window id."""
        for dest, src, layers, (ident,) in zip(self.block_parts(), parts, self._part_layers,
                                               self._part_ids([block])):
            if self._is_window_part(layers) and ident == self.window.trash:
                continue                              # a tombstone: no window data to keep
            if dest.device.type == "cpu":
                # numpy, not torch: this runs on the tier's reader thread, and a torch copy
                # this large goes parallel and gives that thread an OpenMP pool of its own
                # (radixgate/runtime/engine/cpu_threads.py: the engine's workers then sleep between ops).
                dest.numpy()[:, ident, :num_slots] = src.numpy()
            else:
                dest[:, ident, :num_slots].copy_(src)
