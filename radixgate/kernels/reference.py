"""Plain-torch KV ops: the specification of every kernel and the CPU path of the model.

Layout (docs/ARCHITECTURE.md section 3): per layer ``k_cache``/``v_cache`` are
``[num_blocks, block_size, Hkv, D]``; position ``i`` of a sequence lives in slot
``i % block_size`` of block ``block_table[i // block_size]``. Slot ids are ``block * block_size
+ slot``. Everything here is vectorised: decode rows of a batch go through one batched
``scaled_dot_product_attention``; each multi-token (prefill / prefix-extend) sequence goes through
one SDPA call on its gathered, contiguous K/V (a loop over sequences, never over tokens). GQA is
handled without materialising repeated K/V.

KV dtypes: a float cache (float32 / bfloat16 / float16) stores k, v rounded to its dtype; an
8-bit cache (int8, or float8_e4m3fn) stores codes plus one float16 scale per (token, kv head)
in ``k_scale`` / ``v_scale`` ``[num_blocks, block_size, Hkv]``: ``store_kv`` quantizes with
``scale = absmax / QMAX`` (``quantize_kv``), ``paged_attention`` reads ``code * scale``.
Attention always computes in q's dtype: what it reads is cast (dequantized) to it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from radixgate.kernels import native
from radixgate.kernels.checks import (
    SCALE_DTYPE,
    check_attention_inputs,
    check_index_inputs,
    check_query_and_caches,
    check_tables_device,
    check_copy_inputs,
    check_store_inputs,
)

QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}   # largest code of each 8-bit dtype
NATIVE_DECODE = True                  # decode rows through kernels.native where it fits
# positions read by one native call (rows x padded length) past which torch's two-thread
# SDPA is the faster (measured, AMD EPYC: one row of 150 20.7 vs 24.5 us, of 600 58 vs 53;
# 16 rows of 88 129 vs 175 us, of 300 384 vs 353)
NATIVE_DECODE_MAX_POSITIONS = {1: 448}
NATIVE_DECODE_MAX_POSITIONS_MANY = 2048
# with two or more threads the kernel splits rows x kv heads among torch's OpenMP workers
# (Ice Lake, 2 threads, decode step of the default model: one row of 150 15.5 vs 20.4 ms
# torch, of 600 25.9 vs 27.6; 16 rows of 88 88.6 vs 88.7, of 300 111.8 vs 111.7)
NATIVE_DECODE_MAX_POSITIONS_THREADED = {1: 1024}
NATIVE_DECODE_MAX_POSITIONS_MANY_THREADED = 8192
NATIVE_EXTEND = True                  # short extends over a cached prefix through kernels.native
# up to this many new tokens, the kernel's limit (Ice Lake, 2 threads, a layer against torch's
# masked SDPA: 4 over 2,064 keys 0.49 vs 1.58 ms, 16 1.6 vs 3.3, 64 5.7 vs 7.3; 16 over 512
# 0.34 vs 0.81)
NATIVE_EXTEND_MAX_QUERIES = native.EXTEND_MAX_QUERIES
SCALE_MIN, SCALE_MAX = 2.0 ** -24, 65504.0               # float16's smallest and largest


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, Hkv, D] float -> (codes [T, Hkv, D] in ``dtype``, scales float16 [T, Hkv]).

    One scale per (token, head): ``absmax / QMAX`` rounded to float16 (an all-zero head gets
    the smallest float16, so codes stay finite); codes are ``x / scale`` rounded to nearest
    (int8) or cast to e4m3 (fp8), within ``[-QMAX, QMAX]``.
    """
    qmax = QMAX[dtype]
    x32 = x.float()
    scale = (x32.abs().amax(-1) / qmax).clamp(SCALE_MIN, SCALE_MAX).to(SCALE_DTYPE)  # [T, Hkv]
    scaled = (x32 / scale.float()[..., None]).clamp(-qmax, qmax)                     # [T, Hkv, D]
    codes = scaled.round().to(dtype) if dtype == torch.int8 else scaled.to(dtype)
    return codes, scale


def dequantize_kv(codes: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """codes [..., D] with scales [...] (None: a float cache) -> values [..., D] in ``dtype``."""
    if scale is None:
        return codes.to(dtype)
    return (codes.float() * scale.float()[..., None]).to(dtype)


def reference_store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                       k_scale: torch.Tensor | None = None,
                       v_scale: torch.Tensor | None = None,
                       slot_bounds: tuple[int, int] | None = None) -> None:
    """Write k[t], v[t] ([T, Hkv, D]) into slot ``slot_mapping[t]`` of the caches, in place
    (rounded to the cache's dtype, or quantized with their scales for an 8-bit cache).

    Tokens whose slot is -1 are skipped (padding). Slots must be distinct. ``slot_bounds``:
    the lowest and highest slot of ``slot_mapping`` where the caller knows them (the batch
    builder does), saving a read of the tensor.
    """
    check_store_inputs(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    num_blocks, block_size = k_cache.shape[:2]
    if slot_mapping.numel() == 0:
        return
    if slot_bounds is None:
        slot_bounds = tuple(int(b) for b in torch.aminmax(slot_mapping))  # one pass for both
    low, high = slot_bounds
    if low < 0:
        valid = slot_mapping >= 0                              # [T] bool
        k, v, slot_mapping = k[valid], v[valid], slot_mapping[valid]
        if slot_mapping.numel() == 0:
            return
    if not k_cache.is_cuda and high >= num_blocks * block_size:
        raise ValueError(f"slot {high} is beyond the cache ({num_blocks} x {block_size} slots)")
    for x, cache, scales in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        if scales is None:
            _write_slots(cache, slot_mapping, x.to(cache.dtype))  # [T', Hkv, D]
            continue
        codes, scale = quantize_kv(x, cache.dtype)             # [T', Hkv, D], [T', Hkv]
        _write_slots(cache, slot_mapping, codes)
        _write_slots(scales, slot_mapping, scale)


def _write_slots(cache: torch.Tensor, slot_mapping: torch.Tensor, values: torch.Tensor) -> None:
    """cache[slot // bs, slot % bs] = values[t]: one ``index_copy_`` into the flat slot view of a
    contiguous cache (a third of the cost of two-index assignment), else that assignment
    (one flat index for float8, which ``index_copy_`` does not take on the CPU)."""
    if cache.is_contiguous():
        flat = cache.view(-1, *cache.shape[2:])                   # [num_blocks * bs, ...]
        if cache.dtype == torch.float8_e4m3fn:
            flat[slot_mapping] = values
        else:
            flat.index_copy_(0, slot_mapping, values)
        return
    block_size = cache.shape[1]
    cache[slot_mapping // block_size, slot_mapping % block_size] = values


def reference_copy_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, pairs: torch.Tensor,
                          num_slots: torch.Tensor, k_scale: torch.Tensor | None = None,
                          v_scale: torch.Tensor | None = None) -> None:
    """Copy slots ``[0, num_slots[i])`` of block ``pairs[i, 0]`` into block ``pairs[i, 1]``
    (with their scales, for an 8-bit cache).

    Takes ONE layer's caches: callers loop over layers. Used for copy-on-write when a request's
    reused prefix ends inside a block it does not own. All reads happen before any write, but a
    destination must not also be a source in the same call (the Triton kernel copies pairs in
    parallel), and destinations must be distinct.
    """
    check_copy_inputs(k_cache, v_cache, pairs, num_slots, k_scale, v_scale)
    if pairs.shape[0] == 0:
        return
    block_size = k_cache.shape[1]
    slot_ids = torch.arange(block_size, device=pairs.device)             # [bs]
    keep = slot_ids[None, :] < num_slots.to(torch.int64)[:, None]        # [n, bs]
    src = pairs[:, 0:1].expand(-1, block_size)[keep]                     # [m]
    dst = pairs[:, 1:2].expand(-1, block_size)[keep]                     # [m]
    slots = slot_ids[None, :].expand(pairs.shape[0], -1)[keep]           # [m]
    for cache in (k_cache, v_cache, k_scale, v_scale):
        if cache is not None:
            cache[dst, slots] = cache[src, slots]                        # [m, Hkv(, D)]


def reference_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              block_tables: torch.Tensor, cu_q_lens: torch.Tensor,
                              seq_lens: torch.Tensor, scale: float,
                              plan: AttentionPlan | None = None,
                              k_scale: torch.Tensor | None = None,
                              v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of ragged queries over paged K/V. Returns [T, Hq, D].

    q: [T, Hq, D], the new tokens of every sequence concatenated (sequence b owns rows
    ``cu_q_lens[b]:cu_q_lens[b+1]``; every sequence has at least one). Query i of sequence b sits
    at position ``seq_lens[b] - q_len_b + i`` and attends to positions ``<=`` its own, all read
    from the cache (store_kv runs first). Query head h reads kv head ``h // (Hq // Hkv)``.

    ``plan`` (from ``plan_attention`` on the same tables and lengths) carries the per-step index
    work, so a model computes it once per forward instead of once per layer. K/V are read in
    q's dtype (``k_scale`` / ``v_scale``: the scales of an 8-bit cache).
    """
    if plan is not None and plan.made_from(block_tables, cu_q_lens, seq_lens):
        check_query_and_caches(q, k_cache, v_cache, k_scale, v_scale)   # tables: checked once
        check_tables_device(q, block_tables)
    else:
        check_attention_inputs(q, k_cache, v_cache, block_tables, cu_q_lens, seq_lens,
                               k_scale, v_scale)
    if plan is None:
        plan = plan_attention(block_tables, cu_q_lens, seq_lens, k_cache.shape[1], q.shape[0])
    elif plan.num_tokens != q.shape[0] or plan.block_size != k_cache.shape[1]:
        raise ValueError(f"plan is for {plan.num_tokens} tokens and block size {plan.block_size}, "
                         f"got {q.shape[0]} and {k_cache.shape[1]}")
    caches = (k_cache, v_cache, k_scale, v_scale)
    if plan.ragged is not None:
        return _ragged_attention(q, caches, plan.ragged, scale)
    if plan.decode_rows is None:  # pure decode batch: no scatter needed
        return _decode_attention(q, caches, plan, scale)
    out = torch.empty_like(q)
    if plan.decode_rows.numel():
        out[plan.decode_rows] = _decode_attention(q[plan.decode_rows], caches, plan, scale)
    for index, (begin, q_len, total, blocks) in enumerate(plan.extends):
        rows = q[begin:begin + q_len]
        if _native_extend_fits(rows, k_cache, k_scale, total):
            out[begin:begin + q_len] = native.extend_attention(
                rows, k_cache, v_cache, plan.extend_tables[index], total, scale)
        else:
            out[begin:begin + q_len] = _extend_attention(rows, caches, blocks, total, scale)
    return out


def _ragged_attention(q, caches, plan: RaggedPlan, scale: float) -> torch.Tensor:
    """Every sequence through the fixed-order native kernel, which reads every KV dtype in
    place (``native.ragged_attention``)."""
    k_cache, v_cache, k_scale, v_scale = caches
    if q.dtype != torch.float32 or not q.is_cpu or plan.call is None:
        raise ValueError("deterministic attention needs float32 queries on the CPU with the "
                         "native kernels built")
    return plan.call(q, k_cache, v_cache, scale, k_scale, v_scale)


def _native_extend_fits(q: torch.Tensor, k_cache: torch.Tensor, k_scale, total: int) -> bool:
    """A short extend over a longer sequence (a cache hit's new tokens) goes through
    ``native.extend_attention``: float32 q and cache, at most ``NATIVE_EXTEND_MAX_QUERIES``
    queries, head dim a multiple of 16 up to 256. A whole prompt (q_len == total) keeps
    torch's causal SDPA, the faster there."""
    q_len, _, dim = q.shape
    if not NATIVE_EXTEND or k_scale is not None or q_len > NATIVE_EXTEND_MAX_QUERIES:
        return False
    if q_len >= total or not native.attention_takes_head_dim(dim) or q.dtype != torch.float32:
        return False
    return native.usable(k_cache)


@dataclass(frozen=True)
class AttentionPlan:
    """Index work of one step, shared by every layer (tables and lengths are the same in each).

    Decode rows (q_len == 1) read ``decode_blocks`` (int64 [n * nb], -1 padding read as block 0)
    under ``decode_mask`` (bool [n, 1, 1, nb * bs]); a lone decode row on consecutive blocks
    reads its positions in place instead: ``decode_blocks`` is then a ``slice`` of the flat
    slots (``block * bs + slot``), exactly its length, and ``decode_mask`` is None. A lone
    decode row on scattered blocks (a cached prefix's blocks, then fresh ones) also has
    ``decode_slots``: its positions' flat slot ids (int64 [length]), gathered exactly and
    attended without a mask (the masked, grouped read cost 1.2 ms of a 8.5 ms step). Each extend sequence is
    ``(first row, q_len, total, blocks)`` where blocks is a ``slice`` when its table is a run of
    consecutive block ids (read as a view) or an int64 tensor of block ids (gathered).
    """
    num_tokens: int
    block_size: int
    decode_rows: torch.Tensor | None    # int64 [n] rows of q; None when every row is a decode row
    decode_blocks: torch.Tensor | slice | None
    decode_mask: torch.Tensor | None
    extends: tuple[tuple[int, int, int, slice | torch.Tensor], ...]
    decode_slots: torch.Tensor | None = None
    decode_tables: torch.Tensor | None = None   # int32 [n, nb] the decode rows' block ids
    decode_lens: torch.Tensor | None = None     # int32 [n] and their lengths (native kernel)
    extend_tables: tuple = ()                   # int32 block ids of each extend (native kernel)
    workspace: dict = field(default_factory=dict, compare=False, repr=False)
    sources: tuple = field(default=(), compare=False, repr=False)   # the checked tables
    ragged: RaggedPlan | None = None            # the deterministic mode's one kernel

    def made_from(self, block_tables, cu_q_lens, seq_lens) -> bool:
        """Planned (and index-checked) from these very tensors: every layer passes the same."""
        s = self.sources
        return len(s) == 3 and s[0] is block_tables and s[1] is cu_q_lens and s[2] is seq_lens

    def gather_buffer(self, name: str, source: torch.Tensor, rows: int) -> torch.Tensor:
        """A reused output for gathering ``rows`` rows of ``source`` ([rows, *source.shape[1:]]
        in its dtype), one per ``name``: every layer gathers into the same memory instead of a
        fresh allocation (safe because a layer is done with it before the next one gathers)."""
        key = (name, source.dtype, source.device, tuple(source.shape[1:]), rows)
        buffer = self.workspace.get(key)
        if buffer is None:
            buffer = torch.empty((rows, *source.shape[1:]), dtype=source.dtype,
                                 device=source.device)
            self.workspace[key] = buffer
        return buffer


@dataclass(frozen=True)
class RaggedPlan:
    """The deterministic mode's attention of one step: every sequence through
    ``native.ragged_attention`` (every KV dtype read in place)."""
    tables: torch.Tensor                 # int32 [n, width] block ids (-1 padding)
    cu_q: torch.Tensor                   # int32 [n + 1]
    totals: torch.Tensor                 # int32 [n]
    tile_rows: int
    call: "native.RaggedCall | None"     # the kernel with these bound (None: not built)


RAGGED_LONG_TILE = 48        # rows an item for prompts (2k prefill, a layer: 8 rows 91 ms, 48 67)
RAGGED_LONG_QUERIES = 128    # a sequence with more queries than this takes the long tile


def plan_ragged(block_tables: torch.Tensor, cu_q_lens: torch.Tensor, seq_lens: torch.Tensor,
                q_lens: list[int], lens: list[int], block_size: int) -> RaggedPlan:
    """The index work of the deterministic mode's attention (tables trimmed to the blocks
    the step reads)."""
    width = max(-(-n // block_size) for n in lens)
    tables = block_tables[:, :width].to(torch.int32).contiguous()
    tile = RAGGED_LONG_TILE if max(q_lens) > RAGGED_LONG_QUERIES else native.RAGGED_TILE_ROWS
    cu_q, totals = cu_q_lens.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous()
    call = native.RaggedCall(tables, cu_q, totals, tile) \
        if native.library() is not None and tables.is_cpu else None
    return RaggedPlan(tables, cu_q, totals, tile, call)


def plan_attention(block_tables: torch.Tensor, cu_q_lens: torch.Tensor, seq_lens: torch.Tensor,
                   block_size: int, num_tokens: int, deterministic: bool = False) -> AttentionPlan:
    """Validate the tables and lengths and precompute the gather indices and masks of one step
    (``deterministic``: only the ragged kernel's, see ``RaggedPlan``)."""
    check_index_inputs(block_tables, cu_q_lens, seq_lens)
    q_lens, lens = _validated_lengths(num_tokens, block_size, block_tables, cu_q_lens, seq_lens)
    if deterministic:
        return AttentionPlan(num_tokens, block_size, None, None, None, (),
                             ragged=plan_ragged(block_tables, cu_q_lens, seq_lens, q_lens, lens,
                                                block_size),
                             sources=(block_tables, cu_q_lens, seq_lens))
    decode = [b for b, n in enumerate(q_lens) if n == 1]
    blocks = mask = slots = None
    if decode:
        pick = None if len(decode) == len(q_lens) else torch.tensor(decode, device=block_tables.device)
        tables = block_tables if pick is None else block_tables[pick]
        num_blocks = -(-max(lens[b] for b in decode) // block_size)
        blocks = tables[:, :num_blocks].clamp_min(0).to(torch.int64).reshape(-1)     # [n * nb]
        lengths = seq_lens if pick is None else seq_lens[pick]
        positions = torch.arange(num_blocks * block_size, device=block_tables.device)  # [L]
        mask = (positions[None, :] < lengths[:, None])[:, None, None, :]              # [n, 1, 1, L]
        if len(decode) == 1:
            run = _extend_blocks(tables[0], num_blocks)
            if isinstance(run, slice):
                first = run.start * block_size
                blocks, mask = slice(first, first + lens[decode[0]]), None
            else:
                offsets = torch.arange(block_size, device=block_tables.device)
                slots = (blocks[:, None] * block_size + offsets).reshape(-1)[:lens[decode[0]]]
    native_read = {}
    if decode:
        native_read = dict(decode_tables=tables[:, :num_blocks].contiguous(),
                           decode_lens=lengths.to(torch.int32).contiguous())
    if len(decode) == len(q_lens):
        return AttentionPlan(num_tokens, block_size, None, blocks, mask, (), slots, **native_read,
                             sources=(block_tables, cu_q_lens, seq_lens))
    starts = cu_q_lens.tolist()
    rows = cu_q_lens[torch.tensor(decode, dtype=torch.int64, device=cu_q_lens.device)].to(torch.int64)
    extends = tuple((starts[b], n, lens[b], _extend_blocks(block_tables[b], -(-lens[b] // block_size)))
                    for b, n in enumerate(q_lens) if n > 1)
    tables = tuple(block_tables[b, :-(-lens[b] // block_size)].to(torch.int32).contiguous()
                   for b, n in enumerate(q_lens) if n > 1)
    return AttentionPlan(num_tokens, block_size, rows, blocks, mask, extends, slots, **native_read,
                         extend_tables=tables, sources=(block_tables, cu_q_lens, seq_lens))


def _extend_blocks(table: torch.Tensor, num_blocks: int) -> slice | torch.Tensor:
    """A sequence's first ``num_blocks`` block ids: a slice when consecutive, else int64 ids."""
    ids = table[:num_blocks].to(torch.int64)
    first = int(ids[0])
    if first >= 0 and bool((ids == torch.arange(first, first + num_blocks, device=ids.device)).all()):
        return slice(first, first + num_blocks)
    return ids


def _validated_lengths(num_tokens: int, block_size: int, block_tables, cu_q_lens,
                       seq_lens) -> tuple[list[int], list[int]]:
    """Per-sequence query lengths and total lengths as Python lists, checked for consistency."""
    starts = cu_q_lens.tolist()
    lens = seq_lens.tolist()
    q_lens = [e - s for s, e in zip(starts, starts[1:])]
    capacity = block_tables.shape[1] * block_size
    if starts[0] != 0 or starts[-1] != num_tokens:
        raise ValueError(f"cu_q_lens must run from 0 to T={num_tokens}, got {starts[0]}..{starts[-1]}")
    for b, (n, total) in enumerate(zip(q_lens, lens)):
        if not 1 <= n <= total:
            raise ValueError(f"sequence {b}: need 1 <= q_len ({n}) <= seq_len ({total})")
        if total > capacity:
            raise ValueError(f"sequence {b}: seq_len {total} exceeds block table capacity {capacity}")
    return q_lens, lens


def _gather(cache: torch.Tensor, scales: torch.Tensor | None, blocks: torch.Tensor,
            dtype: torch.dtype, out: torch.Tensor) -> torch.Tensor:
    """Blocks ``blocks`` of one cache read as ``dtype``: [len(blocks), bs, Hkv, D] (gathered
    into ``out``, the cache's dtype)."""
    picked = torch.index_select(cache, 0, blocks, out=out)
    return dequantize_kv(picked, None if scales is None else scales.index_select(0, blocks), dtype)


def _decode_read(cache: torch.Tensor, scales: torch.Tensor | None, plan: AttentionPlan, name: str,
                 dtype: torch.dtype) -> torch.Tensor:
    """The decode rows' positions of one cache as ``dtype``: [len(blocks), bs, Hkv, D] gathered
    into the plan's buffer, or for a slot slice [length, Hkv, D], a view of the cache (when
    already in ``dtype``)."""
    blocks = plan.decode_blocks
    if isinstance(blocks, slice):
        return dequantize_kv(cache.flatten(0, 1)[blocks],
                             None if scales is None else scales.flatten(0, 1)[blocks], dtype)
    buffer = plan.gather_buffer(name, cache, blocks.numel())
    return _gather(cache, scales, blocks, dtype, buffer)


def _decode_attention(q, caches, plan: AttentionPlan, scale: float) -> torch.Tensor:
    """One query per decode row. q: [n, Hq, D] -> [n, Hq, D]; caches: (k, v, k_scale, v_scale)."""
    k_cache, v_cache, k_scale, v_scale = caches
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    blocks = plan.decode_blocks
    if _native_decode_fits(q, k_cache, k_scale, plan):
        return native.decode_attention(q.contiguous(), k_cache, v_cache, plan.decode_tables,
                                       plan.decode_lens, scale)
    if k_scale is None and k_cache.dtype == q.dtype:
        if isinstance(blocks, slice):
            return _lone_row_attention(q, k_cache.flatten(0, 1)[blocks],
                                       v_cache.flatten(0, 1)[blocks], scale)
        if plan.decode_slots is not None:
            return _lone_row_attention(q, _slot_gather(k_cache, plan, "k"),
                                       _slot_gather(v_cache, plan, "v"), scale)
    length = plan.decode_mask.shape[-1] if plan.decode_mask is not None else blocks.stop - blocks.start
    k = _decode_read(k_cache, k_scale, plan, "k", q.dtype).view(n, length, num_kv_heads, head_dim)
    v = _decode_read(v_cache, v_scale, plan, "v", q.dtype).view(n, length, num_kv_heads, head_dim)
    grouped = q.reshape(n, num_kv_heads, num_heads // num_kv_heads, head_dim)  # [n, Hkv, G, D]
    out = F.scaled_dot_product_attention(grouped, k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=plan.decode_mask, scale=scale)
    return out.reshape(n, num_heads, head_dim)


def _native_decode_fits(q: torch.Tensor, k_cache: torch.Tensor, k_scale, plan: AttentionPlan) -> bool:
    """The decode rows go through the native kernel (``kernels.native``): a float32 cache
    and q, and at most ``NATIVE_DECODE_MAX_POSITIONS`` positions read in all on one thread
    (``..._THREADED`` on several; past that torch's SDPA is the faster)."""
    if not NATIVE_DECODE or k_scale is not None or plan.decode_tables is None:
        return False
    if q.dtype != torch.float32 or not native.usable(k_cache):
        return False
    rows, blocks = plan.decode_tables.shape
    if native.default_threads() > 1:                     # the workers the kernel will get
        limit = NATIVE_DECODE_MAX_POSITIONS_THREADED.get(rows, NATIVE_DECODE_MAX_POSITIONS_MANY_THREADED)
    else:
        limit = NATIVE_DECODE_MAX_POSITIONS.get(rows, NATIVE_DECODE_MAX_POSITIONS_MANY)
    return rows * blocks * plan.block_size <= limit


def _slot_gather(cache: torch.Tensor, plan: AttentionPlan, name: str) -> torch.Tensor:
    """The lone decode row's positions of one float cache, ``plan.decode_slots`` of its flat
    slots, gathered into the plan's reused buffer: [length, Hkv, D]."""
    flat, slots = cache.flatten(0, 1), plan.decode_slots
    return torch.index_select(flat, 0, slots, out=plan.gather_buffer(name, flat, slots.numel()))


def _lone_row_attention(q, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One decode row over its positions' keys and values k, v [L, Hkv, D] in q's dtype (a
    view of consecutive slots or an exact gather: the common single-stream step, fewest
    ops). q: [1, Hq, D] -> [1, Hq, D]."""
    _, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    k = k.unsqueeze(0).transpose(1, 2)                                    # [1, Hkv, L, D]
    v = v.unsqueeze(0).transpose(1, 2)
    rows = q.reshape(1, num_heads, 1, head_dim)        # [1, Hq, 1, D]: GQA over one query
    out = F.scaled_dot_product_attention(rows, k, v, scale=scale,
                                         enable_gqa=num_heads != num_kv_heads)
    return out.view(1, num_heads, head_dim)             # (1.5x the grouped form's speed)


def _read_blocks(cache: torch.Tensor, scales: torch.Tensor | None, blocks: slice | torch.Tensor,
                 total: int, dtype: torch.dtype) -> torch.Tensor:
    """The first ``total`` positions of a sequence read as ``dtype``: [total, Hkv, D] (a view
    for a slice of a cache already in ``dtype``)."""
    def pick(t):
        return (t[blocks] if isinstance(blocks, slice) else t.index_select(0, blocks)).flatten(0, 1)[:total]
    return dequantize_kv(pick(cache), None if scales is None else pick(scales), dtype)


def _extend_attention(q, caches, blocks, total: int, scale: float) -> torch.Tensor:
    """One sequence's q_len > 1 queries at positions [total - q_len, total). -> [q_len, Hq, D]."""
    k_cache, v_cache, k_scale, v_scale = caches
    q_len, num_heads, _ = q.shape
    num_kv_heads = k_cache.shape[2]
    k = _read_blocks(k_cache, k_scale, blocks, total, q.dtype)            # [L, Hkv, D]
    v = _read_blocks(v_cache, v_scale, blocks, total, q.dtype)
    q4 = q.transpose(0, 1)[None]                                          # [1, Hq, Lq, D]
    k4, v4 = k.transpose(0, 1)[None], v.transpose(0, 1)[None]              # [1, Hkv, L, D]
    gqa = num_heads != num_kv_heads
    if q_len == total:
        out = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        query_pos = torch.arange(total - q_len, total, device=q.device)   # [Lq]
        mask = query_pos[:, None] >= torch.arange(total, device=q.device)[None, :]  # [Lq, L]
        out = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out[0].transpose(0, 1)                                        # [Lq, Hq, D]
