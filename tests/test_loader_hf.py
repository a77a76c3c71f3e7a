"""HF directories (config.json + safetensors + tokenizer.json): tiny random Llama (llama3 RoPE
scaling, untied head, sharded), Qwen2 (q/k/v bias), Mistral (with and without its sliding
window), Qwen3 (q/k norms), Gemma 2 (windows, soft-caps, GeGLU, scaled embeddings, four norms),
Gemma 3 (q/k norms, a local rope base, linear scaling on the global layers) and Phi-3 (fused
projections, longrope) written by transformers, then our forward against transformers' own
model loaded from the same directory. Every distinctive feature is on and visible: switched off
in our model, its variant fails."""
import dataclasses
import json

import pytest
import torch

from radixgate.runtime.model.batch import build_forward_batch
from radixgate.runtime.model.kv_cache import KVCache
from radixgate.runtime.model.loader import gguf_tokenizer, load_model
from radixgate.runtime.model.loader_hf import read_hf_config

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
VARIANTS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_theta=5000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "llama-linear": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=True, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=1e6, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8, tie_word_embeddings=True)),
    "qwen3-bias": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=8, attention_bias=True)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        head_dim=8, query_pre_attn_scalar=16, sliding_window=8, attn_logit_softcapping=1.0,
        final_logit_softcapping=2.0)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=8, query_pre_attn_scalar=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 1e6}})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(
        pad_token_id=0, original_max_position_embeddings=32,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": [1.0, 1.5, 2.0, 3.0],
                         "long_factor": [1.0, 4.0, 8.0, 16.0]})),
}
# the features a fresh random model would leave idle (zero biases, unit or zero norms)
RANDOMIZED = ("bias", "norm.weight", "layernorm.weight")
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def assert_close(actual, expected, rtol, atol):
    """Elementwise |a - e| <= atol + rtol |e| (torch.testing.assert_close takes seconds on
    millions of logits)."""
    assert actual.shape == expected.shape
    excess = ((actual - expected).abs() - (atol + rtol * expected.abs())).max().item()
    assert excess <= 0, f"max |diff| {(actual - expected).abs().max().item():.3g} beyond tolerance"


def write_model_dir(path, variant: str, seed: int = 0, shape: dict | None = None):
    """A tiny random model saved by transformers, plus SmolLM2's tokenizer.json (``shape``:
    config fields that replace the tiny ones)."""
    config_cls, model_cls, extra = VARIANTS[variant]
    fields = {**SHAPE, **extra, **(shape or {})}
    config = getattr(transformers, config_cls)(**fields, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():       # biases and norms start at zero or one: make them matter
        for name, tensor in model.named_parameters():
            if name.endswith(RANDOMIZED):
                tensor.normal_(0.0, 0.5)
            if name.endswith(("q_proj.weight", "k_proj.weight")):   # peaked attention: the
                tensor.mul_(8.0)                  # soft-caps and rope factors change it
            if name.endswith("qkv_proj.weight"):
                tensor[:fields["hidden_size"] * 3 // 2].mul_(8.0)     # q and k rows (Phi-3)
    model.save_pretrained(path, max_shard_size="2MB" if variant == "llama" else "1GB")
    gguf_tokenizer("default").backend.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": TEMPLATE}))
    return model


@pytest.fixture(scope="module", params=list(VARIANTS))
def model_pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    reference = write_model_dir(path, request.param)
    return request.param, path, reference, load_model(str(path), device="cpu", weights_dtype="float32")


def test_forward_matches_transformers(model_pair):
    variant, _, reference, ours = model_pair
    ids = ours.tokenizer.encode("Paged attention over a radix tree of prefixes, " * 6)
    assert len(ids) > 40    # beyond llama3's original 16 positions: scaling matters
    cfg = ours.config
    kv = KVCache(cfg.num_layers, 16, 16, cfg.num_kv_heads, cfg.head_dim)
    batch = build_forward_batch([ids], [0], [list(range(16))[::-1]], 16,
                                logits_rows=[list(range(len(ids)))])
    logits = ours.model.forward(batch, kv)
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    assert expected.abs().max() > 1e-2
    assert_close(logits, expected, rtol=1e-4, atol=1e-5)


def test_config_mapping(model_pair):
    variant, path, _, ours = model_pair
    cfg = read_hf_config(path)
    assert dataclasses.replace(ours.config, eos_token_ids=cfg.eos_token_ids,
                               rope_scaling=cfg.rope_scaling) == cfg
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (2, 4, 2, 8)
    assert cfg.attention_bias == (variant in ("qwen2", "qwen3-bias"))
    assert cfg.arch == variant.split("-")[0]
    if variant == "llama":
        assert cfg.rope_theta == 5000.0 and cfg.rope_scaling["rope_type"] == "llama3"
        assert not cfg.tie_word_embeddings and not ours.model.tied
        assert (path / "model.safetensors.index.json").is_file()
    if variant == "qwen2":
        assert ours.model.layers[0].qkv.bias is not None and cfg.rope_theta == 1e6
    assert cfg.qk_norm == (variant in ("qwen3", "qwen3-bias", "gemma3"))
    assert cfg.layer_windows == {"mistral-window": (8, 8), "gemma2": (8, 0),
                                 "gemma3": (8, 0)}.get(variant, ())
    gemma = variant.startswith("gemma")
    assert (cfg.sandwich_norms, cfg.hidden_act == "gelu_tanh") == (gemma, gemma)
    assert cfg.embed_scale == (32 ** 0.5 if gemma else 1.0)
    assert cfg.attention_scale == (16 ** -0.5 if gemma else 8 ** -0.5)
    assert (cfg.attn_softcap, cfg.final_softcap) == ((1.0, 2.0) if variant == "gemma2" else (0, 0))
    assert cfg.rope_local_theta == (10000.0 if variant == "gemma3" else 0.0)
    if variant == "phi3":
        assert cfg.rope_scaling["attention_factor"] == pytest.approx((1 + 2.7725887 / 3.4657359) ** 0.5)
        assert ours.config.rope_scaling["long"]       # a 512-position engine: the long factors


def test_phi3_within_its_original_context_uses_the_short_factors(tmp_path):
    """longrope's factor set is fixed per engine: one of 32 positions (the original context)
    computes with the short factors, as HF does for sequences that short."""
    reference = write_model_dir(tmp_path, "phi3")
    ours = load_model(str(tmp_path), device="cpu", weights_dtype="float32", max_model_len=32)
    assert not ours.config.rope_scaling["long"]
    ids = ours.tokenizer.encode("Paged attention over a radix tree, " * 3)[:30]
    kv = KVCache(ours.config.num_layers, 4, 16, ours.config.num_kv_heads, ours.config.head_dim)
    batch = build_forward_batch([ids], [0], [[0, 1]], 16, logits_rows=[list(range(len(ids)))])
    with torch.inference_mode():
        expected = reference(torch.tensor([ids])).logits[0]
    assert_close(ours.model.forward(batch, kv), expected, rtol=1e-4, atol=1e-5)


def test_tokenizer_and_template_from_directory(model_pair):
    _, _, _, ours = model_pair
    tok = ours.tokenizer
    assert tok.encode("<|im_start|>hi") == gguf_tokenizer("default").encode("<|im_start|>hi")
    assert tok.bos_token_id == 1 and tok.eos_token_id == 2 and 2 in ours.config.eos_token_ids
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "<|im_start|>user\nx<|im_end|>\n"


def test_unsupported_architecture_is_rejected(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"],
                                                      "model_type": "gpt2"}))
    with pytest.raises(NotImplementedError, match="Llama, Mistral, Qwen2, Qwen3, Gemma 2"):
        read_hf_config(tmp_path)


def hub_config(model_type: str, **fields) -> dict:
    """A config.json as the hub has it (no ``layer_types``: transformers fills them in)."""
    return {"model_type": model_type, "vocab_size": 256, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 8192, **fields}


@pytest.mark.parametrize("config, windows, local_theta", [
    (hub_config("gemma2", sliding_window=4096), (4096, 0) * 3, 0.0),
    (hub_config("gemma3_text", sliding_window=512, sliding_window_pattern=3, rope_theta=1e6),
     (512, 512, 0) * 2, 10000.0),
    (hub_config("gemma3_text", sliding_window=512), (512,) * 5 + (0,), 10000.0),
    (hub_config("qwen3", sliding_window=4096, use_sliding_window=True, max_window_layers=4),
     (0,) * 4 + (4096,) * 2, 0.0),
    (hub_config("qwen3", sliding_window=4096), (), 0.0),
    (hub_config("phi3", sliding_window=262144, max_position_embeddings=131072), (), 0.0),
    (hub_config("mistral", sliding_window=4096), (4096,) * 6, 0.0)])
def test_hub_configs_without_layer_types_get_transformers_layer_pattern(config, windows,
                                                                        local_theta):
    from radixgate.runtime.model.loader_hf import config_from_hf
    cfg = config_from_hf(config)
    assert (cfg.layer_windows, cfg.rope_local_theta) == (windows, local_theta)


@pytest.mark.parametrize("fields, match", [
    ({"layer_types": ["chunked_attention"] * 6}, "layer types"),
    ({"use_bidirectional_attention": True}, "bidirectional"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                          "sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
     "sliding layers")])
def test_configs_the_model_cannot_run_are_refused(fields, match):
    from radixgate.runtime.model.loader_hf import config_from_hf
    with pytest.raises(NotImplementedError, match=match):
        config_from_hf(hub_config("gemma3_text", sliding_window=512, **fields))


def test_gemmas_norm_scales_in_float32_before_casting():
    """HF's Gemma RMSNorm: ``(x32 * (1 + w)).to(dtype)``, the multiplier in float32 (in bf16
    1 + 1e-3 rounds to 1)."""
    from radixgate.runtime.model.model import rms_norm
    x = torch.randn(4, 64).to(torch.bfloat16)
    w = 1.0 + torch.full((64,), 1e-3)
    x32 = x.float()
    expected = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * w).to(torch.bfloat16)
    assert torch.equal(rms_norm(x, w, 1e-6), expected)


@pytest.mark.parametrize("variant", ["gemma2", "qwen3"])
def test_the_deterministic_mode_refuses_a_relatives_layer(tmp_path, variant):
    """Windows, soft-caps, q/k and extra norms have no row-invariant path (ARCHITECTURE 5c)."""
    write_model_dir(tmp_path, variant)
    ours = load_model(str(tmp_path), device="cpu", weights_dtype="float32")
    with pytest.raises(ValueError, match="covers the Llama/Qwen2 layer only"):
        ours.model.check_deterministic()
