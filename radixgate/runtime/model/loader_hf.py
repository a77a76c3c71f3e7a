"""Load an HF model directory: config.json + *.safetensors (sharded with an index or not) +
tokenizer.json + tokenizer_config.json (+ chat_template.jinja, generation_config.json).
Architectures: Llama, Mistral (sliding window), Qwen2 (q/k/v bias), Qwen3 (q/k norms), Gemma 2
(windows, soft-capping, GeGLU), Gemma 3 text (windows, q/k norms, a local rope base) and
Phi-3 (fused projections, longrope)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer as HFTokenizer

from radixgate.runtime.model.model_config import ModelConfig, longrope_default_attention_factor
from radixgate.runtime.model.tokenizer import Tokenizer
from radixgate.runtime.model.tokenizer_gguf import END_MARKERS

_ARCHS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
          "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2",
          "Gemma3ForCausalLM": "gemma3", "Phi3ForCausalLM": "phi3"}
_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3",
                "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3"}
_GEMMAS = ("gemma2", "gemma3")
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else (int(value),)


def _arch(cfg: dict) -> str:
    for name in cfg.get("architectures") or ():
        if name in _ARCHS:
            return _ARCHS[name]
    if cfg.get("model_type") in _MODEL_TYPES:
        return _MODEL_TYPES[cfg["model_type"]]
    raise NotImplementedError(f"unsupported architecture {cfg.get('architectures')} / "
                              f"{cfg.get('model_type')}: Llama, Mistral, Qwen2, Qwen3, Gemma 2, "
                              f"Gemma 3 and Phi-3 are supported")


def _activation(cfg: dict) -> str:
    name = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if cfg.get("mlp_bias") or name not in _ACTIVATIONS:
        raise NotImplementedError(f"MLP {name!r}{' with bias' if cfg.get('mlp_bias') else ''}: "
                                  f"only gated SiLU / tanh-GELU MLPs without bias are supported")
    return _ACTIVATIONS[name]


def _rope(cfg: dict) -> tuple[float, dict | None, float]:
    """(rope base, scaling dict or None, the window layers' own base or 0). transformers 4
    writes ``rope_theta``/``rope_scaling``; 5 writes ``rope_parameters``, per layer type for
    Gemma 3."""
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    local = 0.0
    if "full_attention" in rope:
        sliding = rope.get("sliding_attention") or {}
        if sliding.get("rope_type", "default") != "default":
            raise NotImplementedError("a scaled rope on the sliding layers is not supported")
        local = float(sliding.get("rope_theta") or 10000.0)
        rope = dict(rope["full_attention"])
    elif cfg.get("rope_local_base_freq") or cfg.get("model_type") == "gemma3_text":
        local = float(cfg.get("rope_local_base_freq") or 10000.0)     # HF's default
    if float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))) != 1.0:
        raise NotImplementedError("partial rotary embeddings are not supported")
    theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    kind = rope.get("rope_type", rope.get("type", "default"))
    skip = ("rope_theta", "partial_rotary_factor")
    scaling = None if kind in (None, "default") else {k: v for k, v in rope.items() if k not in skip}
    if kind == "longrope":
        scaling = _longrope(cfg, scaling)
    return theta, scaling, local


def _longrope(cfg: dict, scaling: dict) -> dict:
    """Phi-3's longrope with HF's defaults made explicit: the original context and the
    attention factor sqrt(1 + ln(factor) / ln(original)), factor = context / original."""
    original = int(scaling.get("original_max_position_embeddings")
                   or cfg.get("original_max_position_embeddings") or cfg["max_position_embeddings"])
    factor = float(scaling.get("factor") or float(cfg["max_position_embeddings"]) / original)
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = longrope_default_attention_factor(factor, original)
    return {"rope_type": "longrope", "short_factor": list(scaling["short_factor"]),
            "long_factor": list(scaling["long_factor"]),
            "original_max_position_embeddings": original, "attention_factor": float(attention)}


_LAYER_TYPES = ("sliding_attention", "full_attention")


def _default_layer_types(cfg: dict, layers: int) -> list[str]:
    """What transformers fills in where a hub config.json has no ``layer_types``: Gemma 2
    alternates (layer 0 windowed), Gemma 3 makes every ``sliding_window_pattern``-th layer
    global (6), Qwen windows layers from ``max_window_layers`` on, Mistral and Phi-3 all."""
    kind = cfg.get("model_type")
    if kind == "gemma2":
        windowed = [i % 2 == 0 for i in range(layers)]
    elif kind == "gemma3_text":
        period = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        windowed = [(i + 1) % period != 0 for i in range(layers)]
    elif kind in ("qwen2", "qwen3"):
        windowed = [i >= int(cfg.get("max_window_layers") or 0) for i in range(layers)]
    else:
        windowed = [True] * layers
    return [_LAYER_TYPES[0] if w else _LAYER_TYPES[1] for w in windowed]


def _windows(cfg: dict, layers: int) -> tuple[int, ...]:
    """Per layer the sliding window (0: global), from ``sliding_window`` and ``layer_types``
    (or transformers' defaults for them); () when every layer is global. A window as long as
    the context (Phi-3 128k's 262,144) is no window."""
    window = int(cfg.get("sliding_window") or 0)
    if window <= 0 or window >= int(cfg.get("max_position_embeddings") or 0) or (
            cfg.get("model_type") in ("qwen2", "qwen3") and not cfg.get("use_sliding_window")):
        return ()
    if cfg.get("use_bidirectional_attention"):
        raise NotImplementedError("bidirectional attention is not supported")
    types = cfg.get("layer_types") or _default_layer_types(cfg, layers)
    unknown = set(types) - set(_LAYER_TYPES)
    if unknown or len(types) != layers:
        raise NotImplementedError(f"layer types {sorted(unknown) or types} are not supported "
                                  f"(sliding_attention, full_attention per layer)")
    windows = tuple(window if t == _LAYER_TYPES[0] else 0 for t in types)
    return windows if any(windows) else ()


def _gemma_fields(cfg: dict, arch: str) -> dict:
    if arch not in _GEMMAS:
        return {}
    return dict(embed_scale=float(cfg["hidden_size"]) ** 0.5, sandwich_norms=True,
                query_scale=float(cfg.get("query_pre_attn_scalar") or cfg["head_dim"]) ** -0.5,
                attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
                final_softcap=float(cfg.get("final_logit_softcapping") or 0.0))


def config_from_hf(cfg: dict, generation: dict | None = None) -> ModelConfig:
    """ModelConfig from config.json (transformers 4 ``rope_theta``/``rope_scaling`` or 5
    ``rope_parameters``)."""
    arch = _arch(cfg)
    heads = int(cfg["num_attention_heads"])
    theta, scaling, local_theta = _rope(cfg)
    eos = _ids(cfg.get("eos_token_id")) + _ids((generation or {}).get("eos_token_id"))
    layers = int(cfg["num_hidden_layers"])
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]), num_layers=layers,
        num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
        bos_token_id=None if cfg.get("bos_token_id") is None else int(cfg["bos_token_id"]),
        eos_token_ids=tuple(sorted(set(eos))), arch=arch, hidden_act=_activation(cfg),
        qk_norm=arch in ("qwen3", "gemma3"), layer_windows=_windows(cfg, layers),
        rope_local_theta=local_theta, **_gemma_fields(cfg, arch))


def read_hf_config(path: str | Path) -> ModelConfig:
    path = Path(path)
    return config_from_hf(_read_json(path / "config.json"), _read_json(path / "generation_config.json"))


def weights_from_hf(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of the directory's safetensors shards, as float32 (HF names)."""
    index = _read_json(path / "model.safetensors.index.json")
    shards = sorted(set(index["weight_map"].values())) if index else \
        sorted(p.name for p in path.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    weights = {}
    for shard in shards:
        for name, tensor in load_file(str(path / shard)).items():
            weights[name] = tensor.float()
    return weights


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _chat_template(path: Path, tok_cfg: dict) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    template = tok_cfg.get("chat_template") or _read_json(path / "chat_template.json").get("chat_template")
    if isinstance(template, list):   # named templates: take "default"
        template = {t["name"]: t["template"] for t in template}.get("default")
    return template


def tokenizer_from_hf(path: str | Path, config: ModelConfig | None = None) -> Tokenizer:
    path = Path(path)
    backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
    tok_cfg = _read_json(path / "tokenizer_config.json")
    specials = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    eos = set(config.eos_token_ids) if config else set()
    eos_text = _token_text(tok_cfg.get("eos_token"))
    main_eos = backend.token_to_id(eos_text) if eos_text else None
    if main_eos is None and config and config.eos_token_ids:
        main_eos = config.eos_token_ids[0]
    if not eos:
        eos = {i for i in specials if backend.id_to_token(i) in END_MARKERS}
    bos_text = _token_text(tok_cfg.get("bos_token"))
    bos = backend.token_to_id(bos_text) if bos_text else (config.bos_token_id if config else None)
    return Tokenizer(backend, bos_token_id=bos, eos_token_ids=eos,
                     chat_template=_chat_template(path, tok_cfg), special_token_ids=specials,
                     eos_token_id=main_eos)


def fold_norm_offsets(config: ModelConfig, weights: dict[str, torch.Tensor]) -> dict:
    """Gemma's RMSNorms multiply by ``1 + w``: every norm weight becomes that multiplier
    (our model, like llama.cpp's files, holds the multiplier itself)."""
    if config.arch in _GEMMAS:
        for name in weights:
            if name.endswith("norm.weight"):
                weights[name] = weights[name] + 1.0
    return weights


def load_hf_dir(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    path = Path(path)
    config = read_hf_config(path)
    weights = fold_norm_offsets(config, weights_from_hf(path))
    return config, weights, tokenizer_from_hf(path, config)
