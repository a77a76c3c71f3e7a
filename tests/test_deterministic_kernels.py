"""The deterministic mode's parts (docs/ARCHITECTURE.md section 5c), each on its own: the
ragged attention kernel, the row-invariant matmuls and the head. A row's bits must not depend
on the rows beside it, on how its sequence was cut into steps, nor on the thread count."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixgate.kernels import native, paged_attention, plan_attention, reference_store_kv
from radixgate.kernels.reference import dequantize_kv
from radixgate.runtime.model.head import RescoredHead
from radixgate.runtime.model.linear import (DenseLinear, Int4Linear, Int8Linear,
                                            quantize_int4_groups, quantize_int8_rows)

pytestmark = pytest.mark.skipif(native.library() is None, reason="no native kernels")

HQ, HKV, D, BS, BLOCKS = 9, 3, 64, 16, 48      # the default model's heads, a scattered cache


@pytest.fixture(scope="module")
def cache():
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(BLOCKS, BS, HKV, D, generator=gen)
    v = torch.randn(BLOCKS, BS, HKV, D, generator=gen)
    table = torch.randperm(BLOCKS, generator=gen).to(torch.int32)
    q = torch.randn(BLOCKS * BS, HQ, D, generator=gen)       # query of position p: q[p]
    return k, v, table, q


def ragged(cache, pieces, threads=None, tile=8):
    """pieces: (first position, last position + 1) of each sequence's new queries, all
    over the same table; returns the rows concatenated."""
    k, v, table, q = cache
    rows = torch.cat([q[a:b] for a, b in pieces])
    cu = torch.tensor([0] + [b - a for a, b in pieces], dtype=torch.int32).cumsum(0)
    totals = torch.tensor([b for _, b in pieces], dtype=torch.int32)
    tables = table[None, :].repeat(len(pieces), 1).contiguous()
    return native.ragged_attention(rows, k, v, tables, cu.to(torch.int32), totals, 0.125,
                                   threads=threads, tile_rows=tile)


def causal_sdpa(cache, total: int) -> torch.Tensor:
    """torch's causal attention of positions 0 .. total - 1 over the table's keys: [T, Hq, D]."""
    k, v, table, q = cache
    keys = k[table.long()].flatten(0, 1)[:total].transpose(0, 1)[None]
    values = v[table.long()].flatten(0, 1)[:total].transpose(0, 1)[None]
    want = F.scaled_dot_product_attention(q[:total].transpose(0, 1)[None], keys, values,
                                          is_causal=True, scale=0.125, enable_gqa=True)
    return want[0].transpose(0, 1)


def test_ragged_attention_matches_causal_sdpa_over_scattered_blocks(cache):
    got = ragged(cache, [(0, 300)])
    assert torch.allclose(got, causal_sdpa(cache, 300), atol=2e-5, rtol=1e-4)


def test_a_position_gets_the_same_bits_however_its_step_was_made(cache):
    whole = ragged(cache, [(0, 400)])                       # one prompt of 400
    assert torch.equal(ragged(cache, [(399, 400)])[0], whole[399])            # a decode row
    assert torch.equal(ragged(cache, [(250, 317)]), whole[250:317])           # a chunk
    beside = ragged(cache, [(40, 41), (250, 317), (0, 130)])                  # with others
    assert torch.equal(beside[0], whole[40]) and torch.equal(beside[1:68], whole[250:317])
    assert torch.equal(beside[68:], whole[:130])
    for threads, tile in ((1, 8), (3, 1), (2, 48)):
        assert torch.equal(ragged(cache, [(0, 400)], threads, tile), whole)


def test_keys_past_a_chunk_fold_in_whichever_way_the_step_splits_them(cache):
    """A query's keys run in chunks of 256 folded in order: a short extend or a decode row
    splits its chunks over workers, a prompt's tile folds them itself; both give the prompt's
    bits, and the rows that straddle a chunk's start fold only what they reach."""
    total = BLOCKS * BS                                     # 768: three chunks
    whole = ragged(cache, [(0, total)])
    assert torch.allclose(whole, causal_sdpa(cache, total), atol=2e-5, rtol=1e-4)
    assert torch.equal(ragged(cache, [(total - 1, total)])[0], whole[-1])     # split, 3 chunks
    assert torch.equal(ragged(cache, [(250, 258)]), whole[250:258])           # straddles 256
    straddle = ragged(cache, [(509, 515), (700, 701), (3, 4)], threads=2)
    assert torch.equal(straddle[:6], whole[509:515]) and torch.equal(straddle[6], whole[700])
    assert torch.equal(straddle[7], whole[3])


def test_ragged_attention_refuses_what_it_cannot_read(cache):
    k, v, table, q = cache
    one = torch.tensor([0, 1], dtype=torch.int32)
    bad = table.clone()[None, :]
    bad[0, 2] = BLOCKS                                       # outside the cache
    with pytest.raises(ValueError, match="outside the cache"):
        native.ragged_attention(q[:1], k, v, bad, one, torch.tensor([40], dtype=torch.int32), 0.1)
    with pytest.raises(ValueError, match="shape not taken"):           # 2 queries, length 1
        native.ragged_attention(q[:2], k, v, table[None, :].contiguous(),
                                torch.tensor([0, 2], dtype=torch.int32),
                                torch.tensor([1], dtype=torch.int32), 0.1)
    with pytest.raises(ValueError, match="cu_q must run"):
        native.ragged_attention(q[:2], k, v, table[None, :].contiguous(), one,
                                torch.tensor([5], dtype=torch.int32), 0.1)


KV_KINDS = (torch.int8, torch.float8_e4m3fn, torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", KV_KINDS, ids=str)
def test_deterministic_plan_reads_every_kv_dtype_in_place(cache, dtype):
    """Each schedule stores its own rows (8-bit: quantized per token) and attends: decode rows
    and whole prompts get the same bits, and those are the bits of a float32 cache holding the
    dequantized values (the kernel converts each value exactly as it reads it)."""
    k, v, table, q = cache
    codes = [torch.zeros(BLOCKS, BS, HKV, D, dtype=dtype) for _ in "kv"]
    eight_bit = codes[0].element_size() == 1
    scales = [torch.zeros(BLOCKS, BS, HKV, dtype=torch.float16) if eight_bit else None
              for _ in "kv"]
    slots = (table.long()[torch.arange(203) // BS] * BS + torch.arange(203) % BS)
    keys, values = k.flatten(0, 1)[:203] * 3, v.flatten(0, 1)[:203] * 3
    reference_store_kv(keys, values, codes[0], codes[1], slots, scales[0], scales[1])

    def attend(first, last):
        tables = table[None, :].contiguous()
        cu = torch.tensor([0, last - first], dtype=torch.int32)
        lens = torch.tensor([last], dtype=torch.int32)
        plan = plan_attention(tables, cu, lens, BS, last - first, deterministic=True)
        return paged_attention(q[first:last], codes[0], codes[1], tables, cu, lens, 0.125,
                               plan=plan, k_scale=scales[0], v_scale=scales[1])

    whole = attend(0, 203)                        # 203: a last block of 11 keys
    assert torch.equal(attend(202, 203)[0], whole[202]) and torch.equal(attend(60, 90), whole[60:90])
    dequantized = [dequantize_kv(c, s, torch.float32) for c, s in zip(codes, scales)]
    tables = table[None, :].contiguous()
    direct = native.ragged_attention(q[:203], *dequantized, tables,
                                     torch.tensor([0, 203], dtype=torch.int32),
                                     torch.tensor([203], dtype=torch.int32), 0.125)
    assert torch.equal(whole, direct)


def test_ragged_attention_refuses_caches_it_cannot_read(cache):
    k, v, table, q = cache
    one, total = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([40], dtype=torch.int32)
    tables = table[None, :].contiguous()
    codes = k.to(torch.int8)
    with pytest.raises(ValueError, match="needs k_scale"):
        native.ragged_attention(q[:1], codes, codes, tables, one, total, 0.1)
    scales = torch.ones(BLOCKS, BS, HKV)                       # float32: not the cache's scales
    with pytest.raises(ValueError, match="float16"):
        native.ragged_attention(q[:1], codes, codes, tables, one, total, 0.1, k_scale=scales,
                                v_scale=scales)
    with pytest.raises(ValueError, match="not taken"):
        native.ragged_attention(q[:1], k, v.double(), tables, one, total, 0.1)


def _layers():
    gen = torch.Generator().manual_seed(1)
    layers = {}
    for n, k in ((3072, 576), (576, 1536)):
        w = torch.randn(n, k, generator=gen) * 0.05
        layers[f"int4 {n}x{k}"] = Int4Linear(*quantize_int4_groups(w))
        layers[f"int8 {n}x{k}"] = Int8Linear(*quantize_int8_rows(w))
        layers[f"f32 {n}x{k}"] = DenseLinear(w)
        layers[f"bf16 {n}x{k}"] = DenseLinear(w.bfloat16())
        layers[f"plain {n}x{k}"] = DenseLinear(w, pack=False)
    return layers


LAYERS = _layers()


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_invariant_matmuls_give_a_row_the_same_bits_at_every_row_count(name):
    layer = LAYERS[name]
    x = torch.randn(130, layer.shape[1], generator=torch.Generator().manual_seed(2))
    kept = torch.get_num_threads()
    try:
        alone = [layer.native(x[r:r + 1], True)[0] for r in (0, 64, 129)]
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rows in (2, 17, 65, 130):
                out = layer.native(x[:rows], True)
                for r, want in zip((0, 64, 129), alone):
                    if r < rows:
                        assert torch.equal(out[r], want), (name, threads, rows, r)
    finally:
        torch.set_num_threads(kept)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_invariant_matmuls_take_no_rows(name):
    """A prefill chunk whose logits nobody reads sends the head no rows: [0, N] back (it
    raised from torch.cat, a 500 for any prompt chunked over the tiny model's dense head)."""
    layer = LAYERS[name]
    for invariant in (True, False):
        out = layer.native(torch.zeros(0, layer.shape[1]), invariant)
        assert out.shape == (0, layer.shape[0])


def test_without_the_mode_row_counts_do_change_bits():
    """Why the mode exists: oneDNN's float32 GEMM of 576 x 1536 blocks differently for one
    and two rows (if this ever passes, torch changed and the tiles may be dropped)."""
    layer = LAYERS["f32 576x1536"]
    x = torch.randn(2, 1536, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(layer.native(x)[0], layer.native(x[:1])[0])


def test_rescored_head_is_row_invariant_in_the_mode():
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(4096, 576, generator=gen) * 0.05
    head = RescoredHead.from_weight(weight, lambda ids: weight[ids])
    h = torch.randn(20, 576, generator=gen)
    out = head(h, True)
    for r in range(20):
        assert torch.equal(out[r], head(h[r:r + 1], True)[0]), r
