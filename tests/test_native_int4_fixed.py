"""``kernels.native.int4_mm_fixed`` (native_int4_fixed.c): the int4 matmul whose group sums
are exact integers, so a row's bits are the same at any row count, thread count, chunk cut
and kernel (VNNI for few rows, AMX tiles for many): what lets the deterministic mode cost
nothing in the int4 layers (docs/ARCHITECTURE.md section 5c)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from radixgate.kernels import native
from radixgate.runtime.model.linear import Int4Linear, quantize_int4_groups

pytestmark = pytest.mark.skipif(not native.has_int4_fixed(), reason="no AVX512-VNNI kernels here")
both_kernels = pytest.mark.skipif(not native.int4_fixed_has_amx(), reason="no AMX here")


def _layer(n: int, k: int, seed: int) -> Int4Linear:
    gen = torch.Generator().manual_seed(seed)
    return Int4Linear(*quantize_int4_groups(torch.randn(n, k, generator=gen) * 0.05), fixed=True)


def _bits(t: torch.Tensor) -> torch.Tensor:
    assert t.dtype == torch.bfloat16
    return t.view(torch.int16)


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 fma through float64 (the product is exact there; the sum rounds once more
    only where exponents are far apart, which these inputs avoid)."""
    return (a.double() * b.double() + c.double()).float()


def _reference(x: torch.Tensor, layer: Int4Linear) -> torch.Tensor:
    """The docstring's arithmetic in torch: fixed-point activations per group of 32, exact
    integer sums, t = fma(I, d, S * m), acc = fma(t, p, acc) group by group, then bf16."""
    n, k = layer.shape
    packed, dm = layer.fixed
    codes = torch.stack([packed & 15, packed >> 4], 3).permute(0, 4, 1, 2, 3, 5).reshape(n, k)
    d, m = (dm[:, :, i].permute(0, 2, 1).reshape(n, k // 32).float() for i in (0, 1))
    groups = x.float().view(x.shape[0], k // 32, 32)
    amax = groups.abs().amax(-1, keepdim=True)
    e = torch.where(amax > 0, torch.frexp(amax).exponent - 1, torch.zeros_like(amax, dtype=torch.int32))
    scaled = groups * torch.pow(2.0, (13 - e).float())
    X = torch.round(scaled.bfloat16().float())                          # <= 8 significant bits
    S = X.sum(-1)                                                       # [M, G]
    p = torch.pow(2.0, (e - 13).float())[..., 0]                        # [M, G]
    I = torch.einsum("mgj,ngj->mng", X.double(), codes.view(n, k // 32, 32).double()).float()
    acc = torch.zeros(x.shape[0], n)
    for g in range(k // 32):
        t = _fma(I[:, :, g], d[None, :, g], S[:, g:g + 1] * m[None, :, g])
        acc = _fma(t, p[:, g:g + 1], acc)
    return acc.bfloat16()


@pytest.mark.parametrize("n, k", [(128, 64), (960, 576), (576, 1536)])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17, 40, 70])
def test_the_kernel_computes_the_documented_arithmetic(n, k, rows):
    layer = _layer(n, k, seed=n + k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)) * 2
    want = _reference(x, layer)
    for amx in (0, 1, -1, -2) if native.int4_fixed_has_amx() else (0,):
        got = native.int4_mm_fixed(x, *layer.fixed, amx=amx)
        assert torch.equal(_bits(got), _bits(want)), (amx, (got.float() - want.float()).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_s_bits_do_not_depend_on_the_call(dtype):
    """Alone, among others, at any cut, on either kernel, with 1 or 2 threads."""
    layer = _layer(960, 576, seed=3)
    x = (torch.randn(600, 576, generator=torch.Generator().manual_seed(4)) * 3).to(dtype)
    whole = native.int4_mm_fixed(x, *layer.fixed)
    cuts = ((0, 1, 1), (7, 1, 2), (15, 3, 2), (100, 8, 1), (100, 9, 2), (90, 510, 2), (0, 600, 1))
    for start, rows, threads in cuts:
        for amx in (0, 1, -1, -2):
            part = native.int4_mm_fixed(x[start:start + rows].contiguous(), *layer.fixed,
                                        amx=amx, threads=threads)
            assert torch.equal(_bits(part), _bits(whole[start:start + rows])), (start, rows, amx)


def test_it_follows_the_float_product_closely():
    """Activations kept to 8 significant bits (and 2^-13 of their group's largest) and the
    weights exact: within a few bf16 steps of the float64 product, like the bf16 paths."""
    layer = _layer(960, 576, seed=5)
    x = torch.randn(33, 576, generator=torch.Generator().manual_seed(6))
    want = x.double() @ layer.dequantized_t(torch.float32).double()
    got = layer.native(x).double()
    assert (got - want).abs().max() <= 4 * 2 ** -8 * want.abs().max()
    assert (got - want).abs().mean() <= 2 ** -8 * want.abs().mean()


def test_extreme_and_zero_groups():
    layer = _layer(128, 64, seed=7)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(40, 64, generator=gen) * torch.logspace(-30, 30, 40)[:, None]
    x[3] = 0
    x[5, :32] = 0
    got = native.int4_mm_fixed(x, *layer.fixed)
    assert torch.equal(_bits(got), _bits(_reference(x, layer)))
    assert torch.equal(got[3].float(), torch.zeros(128))


def test_shapes_and_scales_it_does_not_take():
    layer = _layer(128, 64, seed=9)
    with pytest.raises(ValueError, match="contiguous"):
        native.int4_mm_fixed(torch.randn(3, 64).half(), *layer.fixed)
    with pytest.raises(ValueError, match="do not match"):
        native.int4_mm_fixed(torch.randn(3, 96), *layer.fixed)
    codes, scale, zero = quantize_int4_groups(torch.randn(96, 64))
    assert native.int4_fixed_pack(codes, scale, zero) is None              # N not of 64
    codes, scale, zero = quantize_int4_groups(torch.randn(128, 64))
    assert native.int4_fixed_pack(codes, scale * 1e6, zero) is None        # beyond float16
    layer = Int4Linear(codes, scale * 1e6, zero)                          # torch's pack then
    assert layer.fixed is None and layer.packed is not None


def test_the_layer_runs_it_in_both_modes(monkeypatch):
    layer = _layer(960, 576, seed=10)
    calls = []
    real = layer._fixed_mm
    monkeypatch.setattr(layer, "_fixed_mm", lambda x: calls.append(x.shape[0]) or real(x))
    x = torch.randn(20, 576)
    default, invariant = layer.native(x), layer.native(x, invariant=True)
    assert calls == [20, 20] and torch.equal(_bits(default), _bits(invariant))


def _via_codes(parts):
    from radixgate.runtime.model.weights import _int4_parts
    return native.int4_fixed_pack(*_int4_parts(parts))


def test_the_default_models_blocks_pack_straight_to_the_bits_of_the_codes_path():
    """Every int4 matmul of the default GGUF (Q4_1, q/k rows un-permuted), stacked as the
    model stacks them: packed codes and float16 d, m from the raw blocks equal the loader's
    codes path bit for bit, and the model the loader builds holds exactly those."""
    from radixgate.runtime.model.loader_gguf import read_gguf_weights
    from radixgate.runtime.model.weights import _fixed_from_blocks
    from radixgate.runtime.model.loader import resolve_path
    config, weights = read_gguf_weights(resolve_path("default"))
    stacks = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("self_attn", ("o_proj",)),
              ("mlp", ("gate_proj", "up_proj")), ("mlp", ("down_proj",)))
    for layer in range(config.num_layers):
        for block, names in stacks:
            parts = [weights[f"model.layers.{layer}.{block}.{n}.weight"] for n in names]
            direct, coded = _fixed_from_blocks(parts, torch.device("cpu")), _via_codes(parts)
            assert direct is not None and coded is not None
            assert torch.equal(direct[0], coded[0])
            assert torch.equal(direct[1].view(torch.int16), coded[1].view(torch.int16))
    from radixgate.runtime.model.loader import load_model
    built = load_model("default").model.layers[-1].gate_up.fixed
    gate_up = _via_codes([weights[f"model.layers.{config.num_layers - 1}.mlp.{n}.weight"]
                          for n in ("gate_proj", "up_proj")])
    assert torch.equal(built[0], gate_up[0]) and torch.equal(built[1], gate_up[1])


def test_q4_0_and_q4_1_blocks_pack_to_the_codes_paths_bits():
    """Random Q4_0 and Q4_1 blocks, with zero, tiny and large scales: the same bits as the
    codes path; a Q4_0 scale whose -8 d overflows float16 is refused (None), as there."""
    from radixgate.runtime.model.gguf_quants import group_codes
    rng = np.random.default_rng(3)

    class Part:
        def __init__(self, blocks, qtype):
            self.blocks, self.qtype = blocks, qtype

        def q4_blocks(self):
            return self.blocks

        def group_codes(self):
            rows, groups, _ = self.blocks.shape
            return group_codes(self.blocks.reshape(-1), self.qtype, (rows, groups * 32))

    def blocks(rows, groups, wide, scale):
        b = rng.integers(0, 256, (rows, groups, 20 if wide else 18), dtype=np.uint8)
        d = (rng.standard_normal((rows, groups)) * scale).astype(np.float16)
        d[0, 0], d[-1, -1] = 0, np.float16(6e-8)                  # zero, subnormal
        b[:, :, 0:2] = d.view(np.uint8).reshape(rows, groups, 2)
        if wide:
            m = (rng.standard_normal((rows, groups)) * scale).astype(np.float16)
            b[:, :, 2:4] = m.view(np.uint8).reshape(rows, groups, 2)
        return b

    from gguf import GGMLQuantizationType as QT
    for wide, qtype in ((False, QT.Q4_0), (True, QT.Q4_1)):
        parts = [Part(blocks(48, 4, wide, 0.02), qtype), Part(blocks(16, 4, wide, 300.0), qtype)]
        direct = native.int4_fixed_from_q4([p.blocks for p in parts], [wide] * 2)
        coded = _via_codes(parts)
        assert direct is not None and coded is not None
        assert torch.equal(direct[0], coded[0])
        assert torch.equal(direct[1].view(torch.int16), coded[1].view(torch.int16))
    huge = blocks(64, 1, False, 1.0)
    huge[0, 0, 0:2] = np.array([9000.0], np.float16).view(np.uint8)    # -8 d = -72000
    assert native.int4_fixed_from_q4([huge], [False]) is None
    assert _via_codes([Part(huge, QT.Q4_0)]) is None
