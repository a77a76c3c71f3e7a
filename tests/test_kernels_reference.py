"""The torch reference ops (the CPU path) against unpaged SDPA, plus store/copy/dispatch checks."""
from __future__ import annotations

import importlib
import itertools
import sys

import pytest
import torch

from radixgate.kernels import (
    BACKEND_ENV, copy_blocks, paged_attention, reference_copy_blocks, reference_paged_attention,
    reference_store_kv, store_kv,
)
from radixgate.kernels.reference import plan_attention
from radixgate.kernels.testing import contiguous_attention, make_paged_case

# (q_lens, seq_lens) as functions of the block size: every scenario crosses or meets a boundary.
SCENARIOS = {
    "prefill_empty_prefix": lambda bs: ([bs, 2 * bs + 1], [bs, 2 * bs + 1]),
    "extend_prefix_at_and_inside_block": lambda bs: ([bs + 1, 2, 3], [2 * bs + 1, bs + 1, bs + 2]),
    "decode_different_lengths": lambda bs: ([1, 1, 1, 1], [1, bs, bs + 1, 3 * bs - 1]),
    "mixed_decode_and_extend": lambda bs: ([1, 7, 1, bs], [bs + 1, 2 * bs, 3, bs]),
}
SHAPES = list(itertools.product([1, 3, 4], [64, 128], [16, 32]))  # (gqa ratio, head_dim, block)


def _check_against_contiguous(case, out, scale, atol):
    begin = 0
    for key, value, n in zip(case.keys, case.values, case.q_lens):
        expected = contiguous_attention(case.q[begin:begin + n].float(), key.float(), value.float(), scale)
        torch.testing.assert_close(out[begin:begin + n].float(), expected, atol=atol, rtol=atol)
        begin += n


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("ratio,head_dim,block_size", SHAPES)
def test_reference_attention_matches_sdpa_on_contiguous_kv(scenario, ratio, head_dim, block_size):
    q_lens, seq_lens = SCENARIOS[scenario](block_size)
    case = make_paged_case(q_lens, seq_lens, num_heads=2 * ratio, num_kv_heads=2, head_dim=head_dim,
                           block_size=block_size, seed=head_dim + block_size + ratio, fill=7.0)
    scale = head_dim ** -0.5
    out = reference_paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                    case.cu_q_lens, case.seq_lens, scale)
    _check_against_contiguous(case, out, scale, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_attention_in_half_precision_stays_close(dtype):
    case = make_paged_case([1, 20, 1], [17, 40, 33], num_heads=9, num_kv_heads=3, head_dim=64,
                           block_size=16, dtype=dtype, fill=0.0)
    out = reference_paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                    case.cu_q_lens, case.seq_lens, 0.125)
    assert out.dtype == dtype
    _check_against_contiguous(case, out, 0.125, atol=3e-2)


@pytest.mark.parametrize("ratio", [1, 3])
def test_a_lone_decode_row_on_scattered_blocks_gathers_exactly_its_slots(ratio):
    # blocks in random order (a cached prefix's, then fresh ones); every other slot is NaN,
    # so reading one position too many would show
    case = make_paged_case([1], [3 * 16 - 5], num_heads=3 * ratio, num_kv_heads=3, head_dim=64,
                           block_size=16, seed=11)
    table = case.block_tables[0, :3].tolist()
    assert table != list(range(table[0], table[0] + 3))
    plan = plan_attention(case.block_tables, case.cu_q_lens, case.seq_lens, 16, 1)
    assert plan.decode_slots is not None and plan.decode_slots.numel() == 3 * 16 - 5
    out = reference_paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                    case.cu_q_lens, case.seq_lens, 0.125, plan)
    _check_against_contiguous(case, out, 0.125, atol=1e-5)


def test_reference_long_prefix_extend_attends_to_whole_prefix():
    # 300-token prefix + 40 new tokens: the first new query must see all 301 positions.
    case = make_paged_case([40], [340], num_heads=9, num_kv_heads=3, head_dim=64, block_size=16, fill=3.0)
    out = reference_paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                                    case.cu_q_lens, case.seq_lens, 0.125)
    _check_against_contiguous(case, out, 0.125, atol=1e-5)


def test_store_kv_writes_valid_slots_and_skips_minus_one():
    k_cache = torch.zeros(4, 16, 2, 8)
    v_cache = torch.zeros(4, 16, 2, 8)
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots = torch.tensor([17, -1, 63], dtype=torch.int64)
    reference_store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache[1, 1], k[0]) and torch.equal(v_cache[3, 15], v[2])
    assert int((k_cache != 0).any(dim=(2, 3)).sum()) == 2  # token 1 wrote nowhere


def test_store_kv_rejects_slot_beyond_cache():
    caches = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    with pytest.raises(ValueError, match="beyond the cache"):
        reference_store_kv(torch.ones(1, 1, 8), torch.ones(1, 1, 8), *caches, torch.tensor([8]))


def test_copy_blocks_copies_only_the_first_slots_of_each_pair():
    k_cache = torch.randn(6, 16, 2, 8)
    v_cache = torch.randn(6, 16, 2, 8)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    pairs = torch.tensor([[0, 4], [2, 5]], dtype=torch.int64)
    reference_copy_blocks(k_cache, v_cache, pairs, torch.tensor([5, 16], dtype=torch.int32))
    assert torch.equal(k_cache[4, :5], before_k[0, :5]) and torch.equal(k_cache[4, 5:], before_k[4, 5:])
    assert torch.equal(v_cache[5], before_v[2])
    assert torch.equal(k_cache[:4], before_k[:4])  # sources and bystanders untouched


def test_copy_blocks_with_zero_slots_changes_nothing():
    k_cache, v_cache = torch.randn(3, 16, 1, 8), torch.randn(3, 16, 1, 8)
    before = k_cache.clone()
    copy_blocks(k_cache, v_cache, torch.tensor([[0, 1]]), torch.tensor([0], dtype=torch.int32))
    assert torch.equal(k_cache, before)


@pytest.mark.parametrize("mutate,message", [
    (lambda c: c.update(block_tables=c["block_tables"].long()), "block_tables must be torch.int32"),
    (lambda c: c.update(seq_lens=c["seq_lens"] - 30), r"q_len \(\d+\) <= seq_len"),
    (lambda c: c.update(cu_q_lens=c["cu_q_lens"] - 1), "cu_q_lens must run from 0"),
    (lambda c: c.update(q=c["q"][:, :5]), "not a multiple of num kv heads"),
    (lambda c: c.update(q=c["q"].to(torch.int32)), "q must be a float"),
    (lambda c: c.update(seq_lens=c["seq_lens"] + 64), "exceeds block table capacity"),
])
def test_reference_attention_rejects_bad_inputs(mutate, message):
    case = make_paged_case([3, 1], [20, 9], num_heads=6, num_kv_heads=2, head_dim=16, block_size=16, fill=0.0)
    args = dict(q=case.q, k_cache=case.k_cache, v_cache=case.v_cache, block_tables=case.block_tables,
                cu_q_lens=case.cu_q_lens, seq_lens=case.seq_lens)
    mutate(args)
    with pytest.raises(ValueError, match=message):
        reference_paged_attention(**args, scale=0.25)


def test_dispatch_on_cpu_uses_reference_and_matches_it():
    case = make_paged_case([4, 1], [20, 9], num_heads=6, num_kv_heads=2, head_dim=16, block_size=16, fill=0.0)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_q_lens, case.seq_lens, 0.25)
    assert torch.equal(paged_attention(*args), reference_paged_attention(*args))
    k, v = case.new_kv()
    k_cache, v_cache = torch.zeros_like(case.k_cache), torch.zeros_like(case.v_cache)
    store_kv(k, v, k_cache, v_cache, case.slot_mapping)
    assert torch.equal(k_cache.flatten(0, 1)[case.slot_mapping], k)


def test_unknown_backend_is_rejected(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "cuda-graphs")
    with pytest.raises(ValueError, match="kernel backend"):
        copy_blocks(torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8), torch.tensor([[0, 1]]),
                    torch.tensor([1], dtype=torch.int32))


def test_importing_kernels_neither_imports_triton_nor_compiles(monkeypatch):
    # Forget every triton / radixgate.kernels module (monkeypatch restores them), then re-import.
    import radixgate
    monkeypatch.setattr(radixgate, "kernels", sys.modules["radixgate.kernels"])
    for name in list(sys.modules):
        if name.split(".")[0] == "triton" or name.startswith("radixgate.kernels"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    kernels = importlib.import_module("radixgate.kernels")
    assert hasattr(kernels, "paged_attention")
    assert not any(name.split(".")[0] == "triton" for name in sys.modules)
