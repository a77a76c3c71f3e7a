"""Every Triton kernel against its torch reference.

On a machine without CUDA the kernels run on CPU tensors under the Triton interpreter
(TRITON_INTERPRET=1, set here before Triton is imported). Shapes are tiny and the combinations
(GQA ratio 1/3/4, head_dim 64/128, block 16/32, fp32/fp16/bf16, scenario) are sampled with a
fixed seed, covering every pair of values, so the whole file takes about a minute. The cache's
unused slots hold NaN, so any read outside a sequence's valid slots poisons the output.
"""
from __future__ import annotations

import itertools
import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton", reason="triton is not installed: Triton kernels cannot be tested")

from radixgate.kernels import (  # noqa: E402
    BACKEND_ENV, copy_blocks, paged_attention, reference_copy_blocks, reference_paged_attention,
    reference_store_kv, store_kv,
)
from radixgate.kernels.testing import make_paged_case  # noqa: E402
from radixgate.kernels.triton_attention import (  # noqa: E402
    decode_num_splits, prefill_launch, triton_paged_attention,
)

DEVICE = "cuda" if os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _lengths(scenario: str, block_size: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """(q_lens, seq_lens) for a scenario, with lengths drawn at and across block boundaries."""
    edge = lambda: rng.choice([1, 2, block_size - 1, block_size, block_size + 1, 2 * block_size + 1])  # noqa: E731
    if scenario == "prefill":
        lens = [edge() for _ in range(rng.randint(1, 2))]
        return lens, lens
    if scenario == "extend":
        new = [edge() + 1 for _ in range(2)]
        return new, [n + edge() for n in new]
    if scenario == "decode":
        lens = [edge() for _ in range(3)]
        return [1] * len(lens), lens
    new = [1, edge() + 1, 1]  # mixed: decodes around a prefix-extend
    return new, [edge() + n for n in new]


def _pairs(combo) -> set:
    return {((i, a), (j, b)) for (i, a), (j, b) in itertools.combinations(enumerate(combo), 2)}


def _sample_attention_cases(seed: int = 2024):
    """A seeded pairwise-covering sample: every pair of factor values appears in some case."""
    rng = random.Random(seed)
    factors = [[1, 3, 4], [64, 128], [16, 32], ["prefill", "extend", "decode", "mixed"], DTYPES]
    combos = list(itertools.product(*factors))
    rng.shuffle(combos)
    uncovered = set().union(*(_pairs(c) for c in combos))
    cases = []
    while uncovered:
        combo = max(combos, key=lambda c: len(_pairs(c) & uncovered))
        uncovered -= _pairs(combo)
        ratio, head_dim, block_size, scenario, dtype = combo
        q_lens, seq_lens = _lengths(scenario, block_size, rng)
        cases.append(pytest.param(ratio, head_dim, block_size, dtype, q_lens, seq_lens, len(cases),
                                  id=f"{scenario}-gqa{ratio}-d{head_dim}-b{block_size}-{str(dtype)[6:]}"))
    return cases


def _case(q_lens, seq_lens, ratio, head_dim, block_size, dtype, seed):
    num_kv_heads = 1 if ratio > 1 else 2
    return make_paged_case(q_lens, seq_lens, num_heads=num_kv_heads * ratio, num_kv_heads=num_kv_heads,
                           head_dim=head_dim, block_size=block_size, dtype=dtype, device=DEVICE, seed=seed)


def _expected(case, scale):
    k_cache, v_cache = case.finite_caches()
    return reference_paged_attention(case.q.float().cpu(), k_cache.float().cpu(), v_cache.float().cpu(),
                                      case.block_tables.cpu(), case.cu_q_lens.cpu(), case.seq_lens.cpu(), scale)


def _assert_close(out, expected, dtype):
    assert out.dtype == dtype and not out.isnan().any()
    torch.testing.assert_close(out.float().cpu(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("ratio,head_dim,block_size,dtype,q_lens,seq_lens,seed", _sample_attention_cases())
def test_paged_attention_kernel_matches_reference(ratio, head_dim, block_size, dtype, q_lens, seq_lens, seed):
    case = _case(q_lens, seq_lens, ratio, head_dim, block_size, dtype, seed)
    scale = head_dim ** -0.5
    out = paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_q_lens,
                          case.seq_lens, scale, backend="triton")
    _assert_close(out, _expected(case, scale), dtype)


@pytest.mark.parametrize("num_splits", [2, 4])
def test_split_decode_merges_partials_including_empty_splits(num_splits):
    # seq 0 fits one 16-key tile, so most of its splits are empty.
    case = _case([1, 1, 1], [3, 70, 33], 4, 64, 16, torch.float32, seed=num_splits)
    out = triton_paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_q_lens,
                                 case.seq_lens, 0.125, num_splits=num_splits, block_n=16)
    _assert_close(out, _expected(case, 0.125), torch.float32)


def _run_prefill_kernel(case, scale, **tiles):
    """The general kernel, even on batches the dispatcher would send to the decode kernel."""
    out = torch.empty_like(case.q)
    kernel, grid, args, meta = prefill_launch(case.q, case.k_cache, case.v_cache, case.block_tables,
                                              case.cu_q_lens, case.seq_lens, scale, out, **tiles)
    kernel[grid](**args, **meta)
    return out


@pytest.mark.parametrize("ratio", [1, 3])
def test_prefill_kernel_with_small_tiles_handles_many_tiles_per_sequence(ratio):
    # 16-row tiles hold 16 queries (ratio 1) or 4 queries x 4 padded heads (ratio 3): several
    # tiles per sequence, exercising the tile -> sequence search and the head-group rows.
    case = _case([1, 37, 16, 5, 1], [9, 50, 16, 40, 2], ratio, 64, 16, torch.float32, seed=7)
    out = _run_prefill_kernel(case, 0.125, block_m=16, block_n=16)
    _assert_close(out, _expected(case, 0.125), torch.float32)


def test_prefill_kernel_on_a_decode_batch_matches_reference():
    case = _case([1, 1], [17, 32], 1, 128, 32, torch.float16, seed=3)
    out = _run_prefill_kernel(case, 0.1, block_m=16, block_n=32)
    _assert_close(out, _expected(case, 0.1), torch.float16)


def test_decode_splits_only_when_programs_are_few():
    cpu = torch.device("cpu")
    assert decode_num_splits(64, 8, 64, cpu) == 1          # 512 programs fill the device
    assert decode_num_splits(1, 8, 64, cpu) == 16
    assert decode_num_splits(4, 2, 4, cpu) == 1            # too few key tiles to split


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_store_kv_kernel_matches_reference_and_skips_minus_one(dtype):
    case = _case([3, 1, 20], [3, 17, 40], 3, 64, 16, dtype, seed=11)
    k, v = case.new_kv()
    slots = case.slot_mapping.clone()
    slots[::4] = -1
    k_cache = torch.zeros_like(case.k_cache)
    v_cache = torch.zeros_like(case.v_cache)
    expected_k, expected_v = k_cache.clone().cpu(), v_cache.clone().cpu()
    store_kv(k, v, k_cache, v_cache, slots, backend="triton")
    reference_store_kv(k.cpu(), v.cpu(), expected_k, expected_v, slots.cpu())
    assert torch.equal(k_cache.cpu(), expected_k) and torch.equal(v_cache.cpu(), expected_v)
    assert int((k_cache.flatten(0, 1).abs().sum(dim=(1, 2)) > 0).sum()) == int((slots >= 0).sum())


def test_copy_blocks_kernel_matches_reference_for_partial_blocks():
    gen = torch.Generator().manual_seed(5)
    k_cache = torch.randn(8, 32, 3, 128, generator=gen).half().to(DEVICE)
    v_cache = torch.randn(8, 32, 3, 128, generator=gen).half().to(DEVICE)
    pairs = torch.tensor([[0, 5], [3, 6], [1, 7]], dtype=torch.int64, device=DEVICE)
    num_slots = torch.tensor([7, 32, 0], dtype=torch.int32, device=DEVICE)
    expected_k, expected_v = k_cache.clone().cpu(), v_cache.clone().cpu()
    copy_blocks(k_cache, v_cache, pairs, num_slots, backend="triton")
    reference_copy_blocks(expected_k, expected_v, pairs.cpu(), num_slots.cpu())
    assert torch.equal(k_cache.cpu(), expected_k) and torch.equal(v_cache.cpu(), expected_v)


def test_float32_queries_over_a_bfloat16_cache_match_the_reference():
    """A KV cache in another float dtype (``--kv-dtype bfloat16``) is read as q's dtype; the
    store rounds float32 keys to the cache's dtype like the reference does."""
    case = _case([1, 9, 1], [17, 30, 5], 3, 64, 16, torch.float32, seed=4)
    k_cache, v_cache = (c.to(torch.bfloat16) for c in case.finite_caches())
    out = paged_attention(case.q, k_cache, v_cache, case.block_tables, case.cu_q_lens,
                          case.seq_lens, 0.125, backend="triton")
    expected = reference_paged_attention(case.q, k_cache, v_cache, case.block_tables,
                                         case.cu_q_lens, case.seq_lens, 0.125)
    _assert_close(out, expected, torch.float32)
    k, v = case.new_kv()
    stored_k, stored_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    store_kv(k, v, stored_k, stored_v, case.slot_mapping, backend="triton")
    reference_store_kv(k, v, k_cache, v_cache, case.slot_mapping)
    slots = case.slot_mapping      # within one bf16 step: the interpreter truncates, GPUs round
    for stored, expected in ((stored_k, k_cache), (stored_v, v_cache)):
        torch.testing.assert_close(stored.flatten(0, 1)[slots].float(),
                                   expected.flatten(0, 1)[slots].float(), atol=1e-6, rtol=2 ** -7)


def test_launchers_reject_bad_dtypes_and_indices():
    """Inputs and tile sizes are checked before launching."""
    case = _case([2], [5], 1, 64, 16, torch.float32, seed=1)
    with pytest.raises(ValueError, match="q must be a float"):
        triton_paged_attention(case.q.int(), case.k_cache, case.v_cache, case.block_tables,
                               case.cu_q_lens, case.seq_lens, 0.125)
    with pytest.raises(ValueError, match="slot_mapping must be torch.int64"):
        store_kv(case.q[:, :2], case.q[:, :2], case.k_cache, case.v_cache,
                 case.slot_mapping.int(), backend="triton")
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        triton_paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables,
                               case.cu_q_lens, case.seq_lens, 0.125, block_n=24)


def test_backend_environment_variable_routes_cpu_tensors_to_triton(monkeypatch):
    import radixgate.kernels.triton_kv as triton_kv
    calls = []
    original = triton_kv.triton_store_kv
    monkeypatch.setattr(triton_kv, "triton_store_kv", lambda *a: calls.append(1) or original(*a))
    monkeypatch.setenv(BACKEND_ENV, "triton")
    k_cache, v_cache = torch.zeros(2, 16, 1, 16, device=DEVICE), torch.zeros(2, 16, 1, 16, device=DEVICE)
    k = torch.ones(2, 1, 16, device=DEVICE)
    store_kv(k, k, k_cache, v_cache, torch.tensor([3, 17], device=DEVICE))
    assert calls == [1] and k_cache[0, 3].sum() == 16 and k_cache[1, 1].sum() == 16
