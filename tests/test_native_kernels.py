"""``kernels.native``: radixgate's C kernels for the decode step (residual add + RMSNorm,
paged decode attention) against their torch references, row independence, the bounds
check, the fallback without them, and the default model's forward through them."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from radixgate.kernels import native
from radixgate.kernels import reference as ref
from radixgate.kernels.reference import plan_attention, reference_paged_attention


def test_the_kernels_build_on_a_machine_with_a_c_compiler():
    if shutil.which("cc") is None:
        pytest.skip("no C compiler here: the torch ops run (see the fallback test)")
    assert native.library() is not None


needs_native = pytest.mark.skipif(native.library() is None, reason="native kernels not built")


@needs_native
@pytest.mark.parametrize("delta_dtype", [None, torch.bfloat16, torch.float32])
def test_add_rms_norm_is_the_residual_add_then_hf_rms_norm(delta_dtype):
    torch.manual_seed(0)
    x, w = torch.randn(5, 576) * 3, torch.randn(576)
    delta = None if delta_dtype is None else torch.randn(5, 576).to(delta_dtype)
    summed = x if delta is None else x + delta              # fp32 + bf16 promotes exactly
    expected = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    got = native.add_rms_norm(x, delta, w, 1e-5)
    assert torch.equal(x, summed)                           # x updated in place, same bits
    torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-6)
    assert native.add_rms_norm(x, delta, None, 1e-5) is None   # add only
    assert torch.equal(x, summed if delta is None else summed + delta)


@needs_native
def test_a_rows_norm_does_not_depend_on_the_other_rows_of_the_call():
    torch.manual_seed(1)
    x, w = torch.randn(64, 576), torch.randn(576)
    together = native.add_rms_norm(x.clone(), None, w, 1e-5)
    alone = torch.cat([native.add_rms_norm(x[i:i + 1].clone(), None, w, 1e-5) for i in range(64)])
    assert torch.equal(together, alone)


def _scattered_case(rows: int, lengths: list[int], block_size: int = 16, kv_heads: int = 3,
                    heads: int = 9, dim: int = 64, seed: int = 0, fill: float = float("nan")):
    """Caches of 40 blocks, ``fill`` (NaN) where no table points, each row's blocks scattered."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.full((40, block_size, kv_heads, dim), fill)
    v = torch.full_like(k, fill)
    order = torch.randperm(40, generator=gen).tolist()
    width = max(-(-n // block_size) for n in lengths)
    tables = torch.full((rows, width), -1, dtype=torch.int32)
    for r, n in enumerate(lengths):
        picked = [order.pop() for _ in range(-(-n // block_size))]
        tables[r, :len(picked)] = torch.tensor(picked, dtype=torch.int32)
        for p in range(n):
            block, slot = picked[p // block_size], p % block_size
            k[block, slot] = torch.randn(kv_heads, dim, generator=gen)
            v[block, slot] = torch.randn(kv_heads, dim, generator=gen)
    q = torch.randn(rows, heads, dim, generator=gen)
    return q, k, v, tables, torch.tensor(lengths, dtype=torch.int32)


def _count_calls(monkeypatch, name: str) -> list:
    """``native.<name>`` counted: a 1 appended to the returned list per call."""
    calls, real = [], getattr(native, name)
    monkeypatch.setattr(native, name, lambda *a: calls.append(1) or real(*a))
    return calls


def _sdpa(q, k, v, tables, lens, scale):
    """Plain torch: each row's positions gathered in order, GQA SDPA."""
    out = []
    block_size = k.shape[1]
    for r in range(q.shape[0]):
        n = int(lens[r])
        ids = tables[r, :-(-n // block_size)].long()
        kr = k[ids].flatten(0, 1)[:n].transpose(0, 1)            # [Hkv, n, D]
        vr = v[ids].flatten(0, 1)[:n].transpose(0, 1)
        out.append(F.scaled_dot_product_attention(q[r][:, None], kr, vr, scale=scale,
                                                  enable_gqa=True)[:, 0])
    return torch.stack(out)


@needs_native
@pytest.mark.parametrize("lengths", [[1], [37], [150], [5, 88, 16, 33]])
def test_decode_attention_matches_sdpa_on_scattered_blocks_and_reads_no_other_slot(lengths):
    q, k, v, tables, lens = _scattered_case(len(lengths), lengths)
    got = native.decode_attention(q, k, v, tables, lens, 0.125)
    assert not got.isnan().any()                        # a read past a row's slots is NaN
    torch.testing.assert_close(got, _sdpa(q, k, v, tables, lens, 0.125), rtol=1e-5, atol=1e-5)


@needs_native
def test_decode_attention_is_the_same_at_any_thread_count_and_uses_torchs_openmp_pool():
    """Rows x kv heads split among torch's OpenMP workers (the library links the libgomp torch
    loaded, not a second pool): every thread count gives the same bits, and no thread is
    added beside torch's."""
    q, k, v, tables, lens = _scattered_case(5, [150, 3, 64, 97, 16])
    one = native.decode_attention(q, k, v, tables, lens, 0.125, threads=1)
    for threads in (2, 3, 8):
        assert torch.equal(native.decode_attention(q, k, v, tables, lens, 0.125, threads=threads), one)
    for row in range(5):                                 # alone: the same bits as in the call
        alone = native.decode_attention(q[row:row + 1].contiguous(), k, v,
                                        tables[row:row + 1].contiguous(), lens[row:row + 1],
                                        0.125, threads=2)
        assert torch.equal(alone[0], one[row])
    native.shares_torchs_openmp.cache_clear()
    assert native.shares_torchs_openmp() and native.default_threads() == torch.get_num_threads()
    assert native.library().rg_parallel_width(2) == 2    # built with OpenMP: work is shared
    torch.randn(1 << 20).exp().sum()                     # torch's pool is up
    before = len(os.listdir("/proc/self/task"))
    native.decode_attention(q, k, v, tables, lens, 0.125, threads=torch.get_num_threads())
    assert len(os.listdir("/proc/self/task")) == before


@needs_native
def test_a_runtime_mapped_beside_torchs_leaves_the_kernels_on_torchs_pool():
    """The sentencepiece wheel maps a libgomp of its own (the gguf package imports
    sentencepiece where it is installed): the kernels still call torch's, so they keep its
    workers; a second runtime mapped is not a second pool."""
    pytest.importorskip("sentencepiece")
    maps = Path("/proc/self/maps").read_text()
    runtimes = {line.split()[-1] for line in maps.splitlines() if "libgomp" in line}
    assert len(runtimes) == 2, runtimes                 # torch's and sentencepiece's
    native.shares_torchs_openmp.cache_clear()
    assert native.shares_torchs_openmp() and native.default_threads() == torch.get_num_threads()


@needs_native
def test_bound_to_another_openmp_runtime_the_kernels_stay_on_the_calling_thread(monkeypatch):
    """Where the library's OpenMP calls go to another runtime than torch's (a torch on Intel's
    libiomp), the kernels would start a pool of their own: they run on one thread."""
    real = native._gomp_entry
    native.shares_torchs_openmp.cache_clear()
    monkeypatch.setattr(native, "_gomp_entry", lambda lib: real(lib) + (
        0 if "torch" in str(getattr(lib, "_name", "")) else 64))
    try:
        assert not native.shares_torchs_openmp() and native.default_threads() == 1
    finally:
        monkeypatch.setattr(native, "_gomp_entry", real)
        native.shares_torchs_openmp.cache_clear()
    assert native.shares_torchs_openmp()


def _extend_case(q_len: int, total: int, seed: int = 1):
    """q_len new queries at the end of a total-long sequence on scattered blocks (NaN where no
    table points), and what plain SDPA gives each: query i sees positions 0 .. total-q_len+i."""
    _, k, v, tables, _ = _scattered_case(1, [total], seed=seed)
    q = torch.randn(q_len, 9, 64, generator=torch.Generator().manual_seed(seed))
    lens = torch.arange(total - q_len + 1, total + 1, dtype=torch.int32)
    expected = _sdpa(q, k, v, tables.expand(q_len, -1).contiguous(), lens, 0.125)
    return q, k, v, tables[0].contiguous(), expected


@needs_native
@pytest.mark.parametrize("q_len, total", [(2, 2 + 1), (5, 37), (16, 300), (16, 17), (64, 500)])
def test_extend_attention_is_causal_sdpa_over_scattered_blocks(q_len, total):
    q, k, v, table, expected = _extend_case(q_len, total)
    got = native.extend_attention(q, k, v, table, total, 0.125)
    assert not got.isnan().any()                        # a read past the sequence is NaN
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@needs_native
def test_an_extend_rows_bits_do_not_depend_on_threads_or_on_the_rows_beside_it():
    q, k, v, table, _ = _extend_case(16, 300)
    one = native.extend_attention(q, k, v, table, 300, 0.125, threads=1)
    for threads in (2, 3, 7):
        assert torch.equal(native.extend_attention(q, k, v, table, 300, 0.125, threads=threads), one)
    last = native.extend_attention(q[-4:], k, v, table, 300, 0.125, threads=2)
    assert torch.equal(last, one[-4:])                  # the same positions, fewer rows beside


@needs_native
def test_extend_attention_refuses_a_bad_table_or_shape():
    q, k, v, table, _ = _extend_case(4, 40)
    bad = table.clone()
    bad[1] = 40
    with pytest.raises(ValueError, match="outside the cache"):
        native.extend_attention(q, k, v, bad, 40, 0.125)
    with pytest.raises(ValueError, match="outside the cache"):     # too short for 60 positions
        native.extend_attention(q, k, v, table, 60, 0.125)
    with pytest.raises(ValueError, match="shape not taken"):
        native.extend_attention(torch.randn(65, 9, 64), k, v, table, 70, 0.125)


@needs_native
def test_the_reference_path_takes_the_native_extend_for_a_short_extend(monkeypatch):
    q, k, v, table, expected = _extend_case(8, 100)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    tables, lens = table[None], torch.tensor([100], dtype=torch.int32)
    calls = _count_calls(monkeypatch, "extend_attention")
    plan = plan_attention(tables, cu, lens, 16, 8)
    got = reference_paged_attention(q, k, v, tables, cu, lens, 0.125, plan)
    assert calls == [1]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(ref, "NATIVE_EXTEND", False)
    reference_paged_attention(q, k, v, tables, cu, lens, 0.125, plan)
    assert calls == [1]                                 # switched off: torch's SDPA


@needs_native
def test_decode_attention_refuses_a_block_outside_the_cache_or_a_length_past_its_table():
    q, k, v, tables, lens = _scattered_case(1, [20])
    bad = tables.clone()
    bad[0, 1] = 40
    with pytest.raises(ValueError, match="outside the cache"):
        native.decode_attention(q, k, v, bad, lens, 0.125)
    with pytest.raises(ValueError, match="exceeds its table"):
        native.decode_attention(q, k, v, tables, torch.tensor([33], dtype=torch.int32), 0.125)


@needs_native
def test_the_reference_path_takes_the_native_kernel_where_it_fits(monkeypatch):
    q, k, v, tables, lens = _scattered_case(4, [5, 88, 16, 33], fill=0.0)  # torch masks padding
    cu = torch.arange(5, dtype=torch.int32)
    calls = _count_calls(monkeypatch, "decode_attention")
    plan = plan_attention(tables, cu, lens, 16, 4)
    got = reference_paged_attention(q, k, v, tables, cu, lens, 0.125, plan)
    assert calls == [1]
    monkeypatch.setattr(ref, "NATIVE_DECODE", False)
    torch.testing.assert_close(got, reference_paged_attention(q, k, v, tables, cu, lens, 0.125,
                                                              plan), rtol=1e-5, atol=1e-5)


def test_without_the_kernels_the_model_runs_its_torch_ops():
    """RADIXGATE_NATIVE=0 (or no compiler): library() is None and a forward still runs."""
    code = ("import torch\n"
            "from radixgate.kernels import native\n"
            "from radixgate.runtime.model.loader import load_model\n"
            "from radixgate.runtime.model.batch import build_forward_batch\n"
            "from radixgate.runtime.model.kv_cache import KVCache\n"
            "assert native.library() is None\n"
            "m = load_model('default', tiny=True, max_model_len=128)\n"
            "assert not m.model.fused_norms\n"
            "c = m.config\n"
            "kv = KVCache(c.num_layers, 4, 16, c.num_kv_heads, c.head_dim)\n"
            "out = m.model.forward(build_forward_batch([[1, 2, 3]], [0], [[0]], 16), kv)\n"
            "assert out.isfinite().all()\n")
    done = subprocess.run([sys.executable, "-c", code], env={**_env(), native.ENABLE_ENV: "0"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def _env() -> dict:
    import os
    return dict(os.environ)


@needs_native
@pytest.mark.parametrize("ragged", [True, False], ids=["ragged", "decode-extend"])
@pytest.mark.parametrize("weights_dtype, tolerance", [("float32", 2e-3), ("auto", 1.5)])
def test_the_default_models_decode_steps_through_the_kernels_match_its_torch_ops(
        monkeypatch, weights_dtype, tolerance, ragged):
    """At real size (SmolLM2-135M, float32 KV): a prompt's prefix, 8 new tokens over it (the
    extend kernel) and 24 decode steps on scattered blocks, the native kernels (norms, rope
    and store, and attention: the ragged kernel every step, or where it is off the decode and
    extend kernels) on vs off: the same greedy tokens; logits within
    the parity tests' tolerance with float32 weights. With the default int4 weights the
    matmuls take bf16 activations, and a last-bit difference of a norm flips some of their
    roundings (2^-8 each): those logits move up to ~0.9 (measured), as between any two
    orders of the same sums."""
    from radixgate.runtime.model.batch import build_forward_batch
    from radixgate.runtime.model.kv_cache import KVCache
    from radixgate.runtime.model.loader import load_model
    loaded = load_model("default", max_model_len=512, weights_dtype=weights_dtype)
    model, cfg = loaded.model, loaded.config
    assert model.fused_norms
    prompt = loaded.tokenizer.encode("The capital of France is Paris, and the capital of Italy is")
    table = [7, 2, 9, 4, 11, 0]

    from radixgate.runtime.model import model as model_module

    def run(on: bool):
        model.fused_norms = on
        monkeypatch.setattr(ref, "NATIVE_DECODE", on)
        monkeypatch.setattr(model_module, "NATIVE_ROPE_STORE", on)
        monkeypatch.setattr(ref, "NATIVE_EXTEND", on)
        monkeypatch.setattr(model_module, "NATIVE_RAGGED", on and ragged)
        kv = KVCache(cfg.num_layers, 12, 16, cfg.num_kv_heads, cfg.head_dim)
        cut = len(prompt) - 8                   # a cached prefix, then 8 new tokens over it
        logits = [model.forward(build_forward_batch([prompt[:cut]], [0], [table], 16), kv)[-1:]]
        logits.append(model.forward(build_forward_batch([prompt[cut:]], [cut], [table], 16), kv))
        tokens = [int(logits[-1][-1].argmax())]
        for step in range(24):
            logits.append(model.forward(build_forward_batch([[tokens[-1]]], [len(prompt) + step],
                                                            [table], 16), kv))
            tokens.append(int(logits[-1][-1].argmax()))
        return tokens, torch.cat([row[-1:] for row in logits])

    calls = {"attention": 0, "extend": 0, "ragged": 0, "rope": 0, "norm": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call
    monkeypatch.setattr(native, "decode_attention", counted("attention", native.decode_attention))
    monkeypatch.setattr(native, "rope_store", counted("rope", native.rope_store))
    monkeypatch.setattr(native, "add_rms_norm", counted("norm", native.add_rms_norm))
    monkeypatch.setattr(native, "extend_attention", counted("extend", native.extend_attention))
    monkeypatch.setattr(native.RaggedCall, "__call__", counted("ragged", native.RaggedCall.__call__))
    fused_tokens, fused_logits = run(True)
    forwards = 26
    attention = {"attention": 0, "extend": 0, "ragged": forwards * cfg.num_layers} if ragged \
        else {"attention": 24 * cfg.num_layers, "extend": cfg.num_layers, "ragged": 0}
    assert calls == {**attention, "rope": forwards * cfg.num_layers,
                     "norm": forwards * (2 * cfg.num_layers + 2)}
    torch_tokens, torch_logits = run(False)
    model.fused_norms = True
    assert fused_tokens == torch_tokens
    assert (fused_logits - torch_logits).abs().max() < tolerance


@needs_native
def test_topk_indices_are_the_k_largest_and_the_first_of_equal_values():
    torch.manual_seed(2)
    x = torch.randn(3, 49152) * 4
    got = native.topk_indices(x, 32)
    want = x.topk(32, dim=1).indices
    assert [set(r.tolist()) for r in got] == [set(r.tolist()) for r in want]
    ties = torch.zeros(1, 100)
    ties[0, 50] = float("nan")
    assert sorted(native.topk_indices(ties, 5)[0].tolist()) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        native.topk_indices(x, 65)


@needs_native
def test_the_rescored_head_takes_its_top_rows_from_the_native_kernel(monkeypatch):
    from radixgate.runtime.model import head as head_module
    from radixgate.runtime.model.head import RescoredHead
    torch.manual_seed(3)
    weight = torch.randn(4096, 64)
    head = RescoredHead.from_weight(weight, lambda ids: weight[ids])
    calls = []
    real = native.topk_indices
    monkeypatch.setattr(native, "topk_indices", lambda *a: calls.append(1) or real(*a))
    h = torch.randn(2, 64)
    got = head(h)
    assert calls == [1]
    monkeypatch.setattr(head_module, "NATIVE_TOPK_MAX_ROWS", 0)
    assert torch.equal(got, head(h))
    exact = h @ weight.t()
    top = exact.topk(head.k, dim=1).indices
    assert torch.allclose(got.gather(1, top), exact.gather(1, top), atol=1e-5)


@needs_native
def test_rope_store_is_apply_rope_then_store_kv_and_checks_its_slots():
    from radixgate.kernels import store_kv
    from radixgate.runtime.model.rope import apply_rope, rope_cos_sin
    torch.manual_seed(4)
    hq, hkv, d, t = 9, 3, 64, 5
    qkv = torch.randn(t, (hq + 2 * hkv) * d)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    cos, sin = rope_cos_sin(torch.tensor([0, 3, 17, 200, 201]), inv_freq, torch.float32)
    slots = torch.tensor([5, -1, 40, 41, 63])
    k_ref, v_ref = torch.full((4, 16, hkv, d), 7.0), torch.full((4, 16, hkv, d), 7.0)
    k_got, v_got = k_ref.clone(), v_ref.clone()
    qk = apply_rope(qkv[:, :(hq + hkv) * d].view(t, hq + hkv, d), cos, sin)
    store_kv(qk[:, hq:], qkv[:, (hq + hkv) * d:].view(t, hkv, d), k_ref, v_ref, slots)
    q = native.rope_store(qkv, cos, sin, slots, k_got, v_got, hq)
    torch.testing.assert_close(q, qk[:, :hq], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_got, k_ref, rtol=1e-6, atol=1e-6)   # slot -1: untouched
    assert torch.equal(v_got, v_ref)
    with pytest.raises(ValueError, match="beyond the cache"):
        native.rope_store(qkv, cos, sin, torch.tensor([0, 1, 2, 3, 64]), k_got, v_got, hq)
    assert torch.equal(v_got, v_ref)                                  # nothing written


@needs_native
def test_rope_store_into_int8_quantizes_as_quantize_kv_bit_for_bit():
    """The int8 store rounds exactly as reference quantize_kv does on the float32 store's
    values: codes and float16 scales equal for ordinary heads, an all-zero head, heads so
    small that the scale is a float16 subnormal, heads near float16's top, and codes that
    fall exactly halfway, and a scale halfway between two float16s (both rounded to even)."""
    from radixgate.kernels.reference import quantize_kv
    from radixgate.runtime.model.rope import rope_cos_sin
    gen = torch.Generator().manual_seed(6)
    hq, hkv, d, t = 9, 3, 64, 8
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen)
    v = qkv[:, (hq + hkv) * d:].view(t, hkv, d)
    v[0, 0] = 0.0                                            # all zero: the smallest scale
    v[1, 0] *= 1e-7                                          # subnormal float16 scales
    v[1, 1] *= 3e-9
    v[2, 0] *= 5e3                                           # large values
    v[3, 0] = (torch.arange(d) - 32.0) * 0.25               # x / scale = (i - 32) / 2: halfway
    v[3, 0, 0] = 127.0 * 0.5
    v[4, 0, 0] = 127.06201171875                              # scale 1 + 2^-11: a float16 tie
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    cos, sin = rope_cos_sin(torch.arange(t) * 37, inv_freq, torch.float32)
    slots = torch.tensor([5, -1, 40, 41, 63, 0, 17, 2])
    k32, v32 = torch.zeros(4, 16, hkv, d), torch.zeros(4, 16, hkv, d)
    q32 = native.rope_store(qkv, cos, sin, slots, k32, v32, hq)
    codes = [torch.zeros(4, 16, hkv, d, dtype=torch.int8) for _ in "kv"]
    scales = [torch.zeros(4, 16, hkv, dtype=torch.float16) for _ in "kv"]
    q8 = native.rope_store(qkv, cos, sin, slots, *codes, hq, k_scale=scales[0], v_scale=scales[1])
    assert torch.equal(q8, q32)
    kept = slots[slots >= 0]
    for values, got, got_scale in ((k32, codes[0], scales[0]), (v32, codes[1], scales[1])):
        want, want_scale = quantize_kv(values.flatten(0, 1)[kept], torch.int8)
        assert torch.equal(got.flatten(0, 1)[kept], want)
        assert torch.equal(got_scale.flatten(0, 1)[kept].view(torch.int16),
                           want_scale.view(torch.int16))
    assert not codes[0].flatten(0, 1)[1].any()               # slot 1 never written (-1)
    with pytest.raises(ValueError, match="needs k_scale"):
        native.rope_store(qkv, cos, sin, slots, *codes, hq)


@needs_native
def test_a_bf16_norm_is_the_float32_norm_rounded_as_torch_rounds():
    torch.manual_seed(5)
    x, w = torch.randn(7, 576) * 5, torch.randn(576)
    as_float = native.add_rms_norm(x.clone(), None, w, 1e-5)
    as_bf16 = native.add_rms_norm(x.clone(), None, w, 1e-5, torch.bfloat16)
    assert as_bf16.dtype == torch.bfloat16
    assert torch.equal(as_bf16, as_float.to(torch.bfloat16))


@needs_native
def test_silu_mul_has_torchs_bf16_roundings():
    torch.manual_seed(6)
    gate_up = (torch.randn(9, 2 * 1536) * 4).to(torch.bfloat16)
    gate, up = gate_up[:, :1536], gate_up[:, 1536:]
    expected = F.silu(gate) * up
    got = native.silu_mul(gate_up)
    differing = (got != expected).float().mean().item()
    assert differing < 1e-3                 # an exp 1 ulp apart may round the other way
    torch.testing.assert_close(got.float(), expected.float(), rtol=1e-2, atol=1e-2)


@needs_native
def test_silu_mul_is_torchs_bits_with_torchs_own_exp():
    """Where torch's CPU kernels are AVX-512 the kernel calls torch's own 16-lane exp
    (SLEEF's, from libtorch_cpu): every bit as torch's bf16 silu * up, specials included."""
    if native._torch_exp16() is None:
        pytest.skip("torch's AVX-512 exp is not available here")
    assert native.library().rg_exp16_in_use() == 1      # the vectorized loop runs
    torch.manual_seed(7)
    for rows, inner in ((1, 1536), (5, 1536), (3, 100)):          # 100: a 4-lane tail
        gate_up = (torch.randn(rows, 2 * inner) * 6).to(torch.bfloat16)
        gate_up[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 88.0])
        gate, up = gate_up[:, :inner], gate_up[:, inner:]
        expected, got = F.silu(gate) * up, native.silu_mul(gate_up)
        assert torch.equal(got.view(torch.int16)[~expected.isnan()],
                           expected.view(torch.int16)[~expected.isnan()])
        assert torch.equal(got.isnan(), expected.isnan())


def test_a_new_build_goes_to_the_cache_folder_and_replaces_older_ones(tmp_path, monkeypatch):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler here")
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    stale = tmp_path / "native" / "kernels-0000000000000000.so"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an older build")
    built = native._built()
    assert built.parent == tmp_path / "native" and built.exists() and not stale.exists()
    assert native._built() == built                       # found again, not rebuilt


@needs_native
def test_plain_greedy_rows_pick_what_the_processed_path_picks(monkeypatch):
    """NaN as -inf, +inf wins, ties go to the first index, an all-NaN row picks 0; a row
    with a logit bias (or any processor) still goes through the processors."""
    from radixgate.runtime.engine import sampling
    from radixgate.runtime.engine.api import SamplingParams
    torch.manual_seed(7)
    logits = torch.randn(6, 4096)
    logits[0, 10] = float("nan")
    logits[1, 7] = float("inf")
    logits[2, 5] = logits[2, 900] = 99.0
    logits[3] = float("nan")
    logits[4, :] = float("-inf")
    greedy = [SamplingParams(temperature=0.0)] * 6
    calls, real = [], native.argmax_rows
    monkeypatch.setattr(native, "argmax_rows", lambda x: calls.append(1) or real(x))
    fast = sampling.sample_tokens(logits, greedy, [None] * 6)
    assert calls == [1]
    monkeypatch.setattr(native, "usable", lambda *t: False)
    assert fast == sampling.sample_tokens(logits, greedy, [None] * 6)
    assert fast[1] == 7 and fast[2] == 5 and fast[3] == 0 and fast[4] == 0
    monkeypatch.undo()
    biased = [SamplingParams(temperature=0.0, logit_bias=((3, 100.0),))] + greedy[1:]
    assert sampling.sample_tokens(logits, biased, [None] * 6)[0] == 3
