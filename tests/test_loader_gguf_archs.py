"""GGUF files of the Llama relatives, as llama.cpp's own converter writes them: tiny random
Qwen3, Gemma 2, Gemma 3 (text), Phi-3 (LongRoPE, fused qkv / gate_up) and Mistral (sliding
window) checkpoints built with transformers' classes, converted once per module, then read
back with ``read_gguf_weights`` and compared with the safetensors, the HF config (and
loader_hf's reading of it), and, end to end, transformers' logits against our model built from
each file. Also: a q8_0 file, llama.cpp's metadata defaults, and what the converter drops."""
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from radixgate.runtime.model.gguf_file import GGUFFile
from radixgate.runtime.model.gguf_quants import dequantize
from radixgate.runtime.model.loader_gguf import (config_from_gguf, read_gguf_config,
                                                 read_gguf_weights, weights_from_gguf)
from tests.support.archs import BUILDERS, build, hf_config, hf_tensors
from tests.support.convert import convert_many

ARCHS = tuple(BUILDERS)
GEMMA = ("gemma2", "gemma3")
Q8_ARCH = "gemma2"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """arch -> (hf_dir, f32 GGUF); "q8_0" -> Q8_ARCH's q8_0 GGUF. ~20 s on 2 cores."""
    root = tmp_path_factory.mktemp("archs")
    dirs = {arch: build(arch, root / arch) for arch in ARCHS}
    jobs = [(dirs[a], root / f"{a}.gguf", "f32") for a in ARCHS]
    jobs.append((dirs[Q8_ARCH], root / f"{Q8_ARCH}-q8_0.gguf", "q8_0"))
    convert_many(jobs)
    out = {a: (dirs[a], root / f"{a}.gguf") for a in ARCHS}
    out["q8_0"] = root / f"{Q8_ARCH}-q8_0.gguf"
    return out


@pytest.fixture(scope="module")
def loaded(files):
    return {a: read_gguf_weights(files[a][1]) for a in ARCHS}


def _rope(cfg, layer_type: str) -> dict:
    params = cfg.rope_parameters
    return params.get(layer_type, params)


def hf_expected(arch: str) -> dict:
    """What each ModelConfig field means in HF's terms for this checkpoint."""
    cfg = hf_config(arch)
    gemma = arch in GEMMA
    n = cfg.num_hidden_layers
    if gemma:
        windows = tuple(cfg.sliding_window if t == "sliding_attention" else 0
                        for t in cfg.layer_types)
    else:
        windows = (cfg.sliding_window,) * n if cfg.sliding_window else ()
    full = _rope(cfg, "full_attention")
    rope_scaling = None
    if full.get("rope_type") == "linear":
        rope_scaling = {"rope_type": "linear", "factor": full["factor"]}
    elif full.get("rope_type") == "longrope":
        from transformers.modeling_rope_utils import _compute_longrope_parameters
        _, attention_factor = _compute_longrope_parameters(cfg)
        rope_scaling = {"rope_type": "longrope", "short_factor": full["short_factor"],
                        "long_factor": full["long_factor"],
                        "original_max_position_embeddings":
                            full["original_max_position_embeddings"],
                        "attention_factor": attention_factor}
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    act = cfg.hidden_activation if gemma else cfg.hidden_act
    return dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_layers=n,
        num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=full["rope_theta"],
        rope_scaling=rope_scaling, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        attention_bias=bool(getattr(cfg, "attention_bias", False)),
        bos_token_id=cfg.bos_token_id, eos_token_ids=(cfg.eos_token_id,),
        arch={"mistral": "llama"}.get(arch, arch),
        qk_norm=arch in ("qwen3", "gemma3"), layer_windows=windows,
        attn_softcap=getattr(cfg, "attn_logit_softcapping", None) or 0.0,
        final_softcap=getattr(cfg, "final_logit_softcapping", None) or 0.0,
        attention_scale=(cfg.query_pre_attn_scalar if gemma else head_dim) ** -0.5,
        hidden_act={"gelu_pytorch_tanh": "gelu_tanh"}.get(act, act),
        embed_scale=math.sqrt(cfg.hidden_size) if gemma else 1.0, sandwich_norms=gemma,
        local_theta=_rope(cfg, "sliding_attention")["rope_theta"])


# What llama.cpp's converter does not carry over (see test_converter_drops_mistral_window)
DROPPED = {"mistral": {"layer_windows": ()}}


@pytest.mark.parametrize("arch", ARCHS)
def test_config_matches_the_hf_config(loaded, arch):
    config, _ = loaded[arch]
    expected = {**hf_expected(arch), **DROPPED.get(arch, {})}
    local_theta = expected.pop("local_theta")
    scaling = expected.pop("rope_scaling")
    for field in ("rms_norm_eps", "attention_scale"):
        assert getattr(config, field) == pytest.approx(expected.pop(field), rel=1e-6), field
    assert {k: getattr(config, k) for k in expected} == expected
    # window layers' rope: HF's sliding_attention theta (Gemma 3: 10000, no scaling)
    if config.layer_windows:
        assert (config.rope_local_theta or config.rope_theta) == local_theta
    if scaling and scaling["rope_type"] == "longrope":
        ours = config.rope_scaling
        assert ours.keys() == scaling.keys()
        for key in ("short_factor", "long_factor", "attention_factor"):
            np.testing.assert_allclose(ours[key], scaling[key], rtol=1e-6, err_msg=key)
        key = "original_max_position_embeddings"
        assert ours[key] == scaling[key]
    else:
        assert config.rope_scaling == scaling


def test_distinctive_features_are_on(loaded):
    """The checkpoints exercise what they should (guards the builders)."""
    cfg = {a: loaded[a][0] for a in ARCHS}
    assert cfg["gemma2"].layer_windows == (8, 0, 8)           # sliding first, alternating
    assert cfg["gemma3"].layer_windows == (8, 8, 8, 8, 8, 0)  # every 6th layer global
    assert cfg["gemma3"].rope_local_theta == 10000.0 and cfg["gemma3"].rope_theta == 1e6
    assert (cfg["gemma2"].attn_softcap, cfg["gemma2"].final_softcap) == (50.0, 30.0)
    assert cfg["phi3"].layer_windows == (16, 16)
    assert cfg["phi3"].rope_scaling["rope_type"] == "longrope"
    assert cfg["qwen3"].qk_norm and cfg["gemma3"].qk_norm and not cfg["gemma2"].qk_norm


def _expected_weights(arch: str, hf: dict) -> dict:
    """HF tensors as the model holds them: Gemma's norms as the multiplier 1 + w; a tied head
    is not a separate tensor."""
    out = {}
    for name, t in hf.items():
        if arch in GEMMA and name.endswith("norm.weight"):
            t = t + 1.0
        out[name] = t.numpy()
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_weights_equal_the_safetensors(files, loaded, arch):
    config, weights = loaded[arch]
    expected = _expected_weights(arch, hf_tensors(files[arch][0]))
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    assert set(weights) == set(expected)
    for name, want in expected.items():
        got = weights[name].dense()
        assert got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_weight_the_model_needs_is_there(loaded, arch):
    config, weights = loaded[arch]
    attn = (["self_attn.qkv_proj"] if arch == "phi3" else
            ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]) + ["self_attn.o_proj"]
    mlp = ["mlp.gate_up_proj"] if arch == "phi3" else ["mlp.gate_proj", "mlp.up_proj"]
    norms = ["input_layernorm", "post_attention_layernorm"]
    if config.sandwich_norms:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    norms += ["self_attn.q_norm", "self_attn.k_norm"] if config.qk_norm else []
    per_layer = attn + mlp + ["mlp.down_proj"] + norms
    names = {f"model.layers.{i}.{p}.weight" for i in range(config.num_layers) for p in per_layer}
    names |= {"model.embed_tokens.weight", "model.norm.weight"}
    names |= set() if config.tie_word_embeddings else {"lm_head.weight"}
    assert set(weights) == names
    h, d = config.hidden_size, config.head_dim
    qkv = (config.num_heads + 2 * config.num_kv_heads) * d
    if arch == "phi3":
        assert weights["model.layers.0.self_attn.qkv_proj.weight"].shape == (qkv, h)
        gate_up = weights["model.layers.0.mlp.gate_up_proj.weight"]
        assert gate_up.shape == (2 * config.intermediate_size, h)
    if config.qk_norm:
        assert weights["model.layers.0.self_attn.q_norm.weight"].shape == (d,)


def test_only_llama_rows_are_permuted_in_the_file(files, loaded):
    """llama.cpp permutes Q/K rows for NORM rope (llama: Mistral) only; the NEOX-rope archs
    are stored in HF order (their raw rows already equal the safetensors)."""
    for arch in ARCHS:
        gguf = GGUFFile(files[arch][1])
        hf = hf_tensors(files[arch][0])
        name, hf_name = (("blk.0.attn_qkv.weight", "model.layers.0.self_attn.qkv_proj.weight")
                         if arch == "phi3" else
                         ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight"))
        info = gguf.tensors[name]
        raw = dequantize(info.data, info.qtype, info.shape)
        same = np.array_equal(raw, hf[hf_name].numpy())
        assert same == (arch != "mistral"), arch
        assert loaded[arch][1][hf_name].rope_heads == (loaded[arch][0].num_kv_heads
                                                      if arch == "mistral" else 0)


def test_q8_0_file_is_close_to_f32(files, loaded):
    f32_config, f32 = loaded[Q8_ARCH]
    q8_config, q8 = read_gguf_weights(files["q8_0"])
    assert q8_config == f32_config and set(q8) == set(f32)
    quantized = 0
    for name, w in q8.items():
        want = f32[name].dense()
        if w.qtype.name == "Q8_0":
            quantized += 1
            step = np.abs(want).max(axis=-1, keepdims=True) / 127   # half a step per block
            assert np.all(np.abs(w.dense() - want) <= step * 0.5 + 1e-3), name
        else:                                       # norms stay F32, 1 + w included
            assert len(w.shape) == 1, name
            np.testing.assert_array_equal(w.dense(), want, err_msg=name)
    assert quantized == 1 + 7 * q8_config.num_layers    # embedding + 7 matrices a layer


def test_config_only_reader_agrees(files, loaded):
    for arch in ARCHS:
        assert read_gguf_config(files[arch][1]) == loaded[arch][0]


@pytest.mark.parametrize("arch", ARCHS)
def test_same_config_as_the_hf_folder_loader(files, loaded, arch):
    """loader_hf reads the folder the GGUF came from into the same ModelConfig (float32
    metadata read back as its decimal), except where the file lost something: Mistral's
    window and arch name, Phi-3's longrope factors in float32."""
    from dataclasses import replace
    from radixgate.runtime.model.loader_hf import read_hf_config
    ours, theirs = loaded[arch][0], read_hf_config(files[arch][0])
    if arch == "mistral":
        theirs = replace(theirs, arch="llama", layer_windows=())
    if arch == "phi3":
        for key in ("short_factor", "long_factor", "attention_factor"):
            np.testing.assert_allclose(ours.rope_scaling[key], theirs.rope_scaling[key], rtol=1e-6)
        theirs = replace(theirs, rope_scaling=ours.rope_scaling)
    assert ours == theirs


def test_converter_drops_mistral_window(files):
    """convert_hf_to_gguf.py writes MistralForCausalLM as ``llama`` without any sliding window
    key (llama.cpp's llama graph has none): the HF checkpoint had ``sliding_window`` = 8.
    A file that carries ``llama.attention.sliding_window`` gets it on every layer."""
    gguf = GGUFFile(files["mistral"][1])
    assert hf_config("mistral").sliding_window == 8
    assert not any("sliding_window" in k for k in gguf.metadata)
    meta = {**gguf.metadata, "llama.attention.sliding_window": 8}
    assert config_from_gguf(meta, gguf.tensors).layer_windows == (8, 8)


def _meta(files, arch: str) -> tuple[dict, dict]:
    gguf = GGUFFile(files[arch][1])
    return dict(gguf.metadata), gguf.tensors


def test_gemma_metadata_as_llama_cpp_reads_it(files):
    meta, tensors = _meta(files, "gemma3")
    # a per-layer pattern array (newer converters) or a period override the default of 6
    assert config_from_gguf({**meta, "gemma3.attention.sliding_window_pattern":
                             np.array([1, 0, 1, 0, 0, 1], bool)}, tensors).layer_windows \
        == (8, 0, 8, 0, 0, 8)
    assert config_from_gguf({**meta, "gemma3.attention.sliding_window_pattern": 3},
                            tensors).layer_windows == (8, 8, 0, 8, 8, 0)
    # no window: every layer global and one rope for all
    no_swa = config_from_gguf({k: v for k, v in meta.items() if "sliding_window" not in k},
                              tensors)
    assert no_swa.layer_windows == () and no_swa.rope_local_theta == 0.0
    # no freq_base_swa key: llama.cpp's 10000
    del meta["gemma3.rope.freq_base_swa"]
    assert config_from_gguf(meta, tensors).rope_local_theta == 10000.0
    # the 27B models (62 / 46 layers) scale queries by (hidden / heads) ** -0.5
    big = config_from_gguf({**meta, "gemma3.block_count": 62}, tensors)
    assert big.query_scale == pytest.approx((64 // 4) ** -0.5) and big.layer_windows[5] == 0
    meta2, tensors2 = _meta(files, "gemma2")
    wide = {**meta2, "gemma2.embedding_length": 128, "gemma2.block_count": 46}
    assert config_from_gguf(wide, tensors2).query_scale == pytest.approx(32 ** -0.5)
    assert config_from_gguf(meta2, tensors2).query_scale == 16 ** -0.5      # head_dim ** -0.5


def test_phi3_metadata_edge_cases(files):
    meta, tensors = _meta(files, "phi3")
    # without the attn_factor key: transformers' default sqrt(1 + ln(256/64) / ln 64)
    no_factor = {k: v for k, v in meta.items() if k != "phi3.rope.scaling.attn_factor"}
    assert config_from_gguf(no_factor, tensors).rope_scaling["attention_factor"] == \
        pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))
    with pytest.raises(ValueError, match="TensorInfo"):
        config_from_gguf(meta, tensors.keys())          # factors are tensors
    with pytest.raises(NotImplementedError, match="partial rotary"):
        config_from_gguf({**meta, "phi3.rope.dimension_count": 12}, tensors)
    # Phi-3 without LongRoPE (the 4k models): no factor tensors, no scaling
    plain = {k: v for k, v in tensors.items() if not k.startswith("rope_factors")}
    assert config_from_gguf(meta, plain).rope_scaling is None


def test_an_unmapped_tensor_is_an_error_not_dropped(files, loaded):
    gguf = GGUFFile(files["qwen3"][1])
    config = loaded["qwen3"][0]
    extra = SimpleNamespace(tensors={**gguf.tensors,
                                     "cls_out.weight": gguf.tensors["output_norm.weight"]})
    with pytest.raises(NotImplementedError, match="cls_out"):
        weights_from_gguf(extra, config)


def test_gemma_norms_in_the_file_are_one_plus_hf(files, loaded):
    """The converter stores Gemma's norms (q/k norms of Gemma 3 too) as 1 + w: read as they
    are, they are the multiplier the model holds, not HF's w."""
    for arch in GEMMA:
        hf = hf_tensors(files[arch][0])
        weights = loaded[arch][1]
        names = [n for n in hf if n.endswith("norm.weight")]
        assert any("q_norm" in n for n in names) == (arch == "gemma3")
        for name in names:
            got = torch.from_numpy(weights[name].dense())
            assert torch.equal(got, hf[name] + 1.0), name
            assert not torch.allclose(got, hf[name]), name


@pytest.mark.parametrize("arch", ARCHS)
def test_model_from_the_gguf_matches_transformers(files, loaded, arch):
    """End to end: our model built from the GGUF's config and weights gives transformers'
    logits on the folder it came from, over 3 windows of positions (Mistral: within its
    window only, which the file lost; Phi-3: short factors, as HF within the original
    context of 64)."""
    from transformers import AutoModelForCausalLM
    from radixgate.runtime.model.batch import build_forward_batch
    from radixgate.runtime.model.kv_cache import KVCache
    from radixgate.runtime.model.model import LlamaModel
    from radixgate.runtime.model.rope import for_context
    config, weights = loaded[arch]
    config = for_context(config, 64)
    model = LlamaModel(config, weights, device="cpu", dtype=torch.float32, weights_dtype="float32")
    n = 8 if arch == "mistral" else 24
    ids = torch.randint(0, config.vocab_size, (n,),
                        generator=torch.Generator().manual_seed(1)).tolist()
    kv = KVCache(config.num_layers, 4, 16, config.num_kv_heads, config.head_dim)
    batch = build_forward_batch([ids], [0], [[0, 1]], 16, logits_rows=[list(range(n))])
    reference = AutoModelForCausalLM.from_pretrained(files[arch][0], dtype=torch.float32).eval()
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    ours = model.forward(batch, kv)
    excess = ((ours - expected).abs() - (1e-4 + 1e-4 * expected.abs())).max().item()
    assert excess <= 0, f"max |diff| {(ours - expected).abs().max().item():.3g}"


def test_a_q8_0_gemma_serves_as_it_would_be_loaded_and_caches_exactly(files):
    """The quantized path on a relative: the q8_0 Gemma 2 file through ``load_model`` (weights
    kept int8, products in bf16) stays near transformers' float logits, and an engine's greedy
    answers agree with the prefix cache on and off."""
    from transformers import AutoModelForCausalLM
    from radixgate.runtime.engine.engine import Engine
    from radixgate.runtime.model.loader import load_model
    from tests.support.engine import engine_config
    from tests.support.engine_compare import assert_clean, compare_greedy, greedy
    ours = load_model(str(files["q8_0"]), device="cpu", max_model_len=128, weights_dtype="int8")
    assert ours.weights_dtype == "int8" and ours.config.layer_windows
    ids = list(range(40, 72))
    reference = AutoModelForCausalLM.from_pretrained(files[Q8_ARCH][0], dtype=torch.float32)
    with torch.inference_mode():
        expected = reference.eval()(torch.tensor([ids])).logits[0, -1]
    engines = [Engine(ours, engine_config(num_blocks=32, enable_prefix_cache=cache,
                                          record_logits=True, adapt_threads=False)).start()
               for cache in (True, False)]
    try:
        cached, plain = engines
        cached.generate(greedy(ids[:20] + [5], max_tokens=1))
        got = cached.generate(greedy(ids, max_tokens=4))
        ref = plain.generate(greedy(ids, max_tokens=4))
        assert got.usage.cache_read_tokens >= 16
        # int8 weights: an 11-row extend goes through the int8 op, a 32-row prefill through
        # the wide GEMM (linear.INT8_OP_MAX_ROWS), so the logits differ by their rounding
        # (0.08 of 14 here; 0.0 with float32 weights)
        compare_greedy(cached, got, plain, ref, logit_tol=0.2)
        first = plain.debug_trace(ref.request_id).logits[0]
        assert (first - expected).abs().max() < 0.05 * expected.abs().max()
        assert_clean(cached)
    finally:
        for engine in engines:
            engine.shutdown(grace_s=0)
