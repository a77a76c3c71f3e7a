"""``kernels.native.int4_mm`` (native_int4.c): torch's CPU int4 matmul with its very bits at
any row count, thread count and chunk cut, so the deterministic mode may run it above a few
rows and the op below, where the layer keeps torch's pack (a CPU without AVX512-VNNI; the
fixed layout's kernel is tests/test_native_int4_fixed.py's) (docs/ARCHITECTURE.md section 5c)."""
from __future__ import annotations

import pytest
import torch

from radixgate.kernels import native
from radixgate.runtime.model import linear
from radixgate.runtime.model.linear import Int4Linear, quantize_int4_groups

# where torch runs its AVX-512 int4 kernel and ours is built, they must agree (not skipped
# because they differ: that is the failure these tests look for)
AVX512 = torch.backends.cpu.get_cpu_capability() == "AVX512" and native.library() is not None \
    and native.int4_mm(torch.zeros(1, 32, dtype=torch.bfloat16),
                       torch.zeros(64, 16, dtype=torch.uint8),
                       torch.zeros(1, 64, 2, dtype=torch.bfloat16), 32) is not None
pytestmark = pytest.mark.skipif(not AVX512, reason="torch's int4 op is not its AVX-512 kernel "
                                                   "here, or no native kernels")


def test_the_self_check_lets_the_model_use_it():
    assert native.int4_mm_matches_torch()


def _layer(n: int, k: int, seed: int) -> Int4Linear:
    gen = torch.Generator().manual_seed(seed)
    return Int4Linear(*quantize_int4_groups(torch.randn(n, k, generator=gen) * 0.05),
                      fixed=False)                                # torch's pack


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype == torch.bfloat16 and torch.equal(a.view(torch.int16),
                                                                 b.view(torch.int16))


@pytest.mark.parametrize("n, k", [(960, 576), (3072, 576), (576, 1536)])
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 95, 96, 97, 193])
def test_the_kernel_gives_the_op_s_bits(n, k, rows):
    layer = _layer(n, k, seed=n + k)
    x = (torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)) * 3).bfloat16()
    op = torch.ops.aten._weight_int4pack_mm_for_cpu(x, layer.packed, 32, layer.scales_and_zeros)
    for threads in (1, 2):
        ours = native.int4_mm(x, layer.packed, layer.scales_and_zeros, 32, threads=threads)
        assert _same_bits(ours, op), (rows, threads, (ours.float() - op.float()).abs().max())


def test_extreme_values_round_as_the_op_does():
    """Large, tiny and mixed-sign activations: the rounding to bf16 at the end, ties included."""
    layer = _layer(128, 64, seed=7)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(40, 64, generator=gen) * torch.logspace(-20, 20, 40)[:, None]
    x = x.bfloat16()
    op = torch.ops.aten._weight_int4pack_mm_for_cpu(x, layer.packed, 32, layer.scales_and_zeros)
    assert _same_bits(native.int4_mm(x, layer.packed, layer.scales_and_zeros, 32), op)


def test_shapes_it_does_not_take_are_refused():
    layer = _layer(128, 64, seed=9)
    with pytest.raises(ValueError, match="bf16"):
        native.int4_mm(torch.randn(3, 64), layer.packed, layer.scales_and_zeros, 32)
    with pytest.raises(ValueError, match="do not match"):
        native.int4_mm(torch.randn(3, 96).bfloat16(), layer.packed, layer.scales_and_zeros, 32)


def test_the_deterministic_mode_runs_it_above_a_few_rows(monkeypatch):
    layer = _layer(960, 576, seed=10)
    x = torch.randn(linear.NATIVE_INT4_MIN_ROWS + 1, 576)
    calls = []
    real = native.int4_mm
    monkeypatch.setattr(native, "int4_mm", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    invariant = layer.native(x, invariant=True)
    layer.native(x[:linear.NATIVE_INT4_MIN_ROWS], invariant=True)
    assert calls == [x.shape]
    alone = torch.cat([layer.native(x[r:r + 1], invariant=True) for r in range(x.shape[0])])
    assert _same_bits(invariant, alone)


amx = pytest.mark.skipif(not native.has_amx_int4(), reason="no AMX here")


@amx
@pytest.mark.parametrize("n, k", [(960, 576), (576, 1536)])
def test_the_amx_kernel_multiplies_by_the_bf16_weights(n, k):
    layer = _layer(n, k, seed=11)
    w = layer.dequantized_t(torch.float32).T.bfloat16().float()         # [N, K] rounded
    x = torch.randn(37, k, generator=torch.Generator().manual_seed(12)).bfloat16()
    want = x.float() @ w.T
    got = native.int4_mm_amx(x, layer.packed, layer.scales_and_zeros, 32).float()
    # float32 sums in another order, then bf16: within a few bf16 steps of the largest
    assert (got - want).abs().max() <= 4 * 2 ** -8 * want.abs().max()
    assert (got - want).abs().mean() <= 2 ** -9 * want.abs().mean()


@amx
def test_an_amx_row_does_not_depend_on_the_rows_beside_it():
    layer = _layer(960, 576, seed=13)
    x = torch.randn(600, 576, generator=torch.Generator().manual_seed(14)).bfloat16()
    whole = native.int4_mm_amx(x, layer.packed, layer.scales_and_zeros, 32)
    for start, rows, threads in ((0, 1, 1), (7, 1, 2), (15, 3, 2), (100, 17, 1), (90, 510, 2)):
        part = native.int4_mm_amx(x[start:start + rows].contiguous(), layer.packed,
                                  layer.scales_and_zeros, 32, threads=threads)
        assert _same_bits(part, whole[start:start + rows]), (start, rows, threads)


@amx
def test_the_default_mode_runs_amx_from_a_few_rows_and_the_op_below(monkeypatch):
    layer = _layer(960, 576, seed=15)
    calls = []
    real = native.int4_mm_amx
    monkeypatch.setattr(native, "int4_mm_amx",
                        lambda *a, **kw: calls.append(a[0].shape[0]) or real(*a, **kw))
    for rows in (1, linear.AMX_INT4_MIN_ROWS, linear.AMX_INT4_MIN_ROWS + 1, 300):
        layer.native(torch.randn(rows, 576))
    layer.native(torch.randn(300, 576), invariant=True)       # the deterministic mode: never
    assert calls == [linear.AMX_INT4_MIN_ROWS + 1, 300]
