"""Load an HF model directory: config.json + *.safetensors (sharded with an index or not) +
tokenizer.json + tokenizer_config.json (+ chat_template.jinja, generation_config.json).
Architectures: Llama, Mistral, Qwen2 (q/k/v bias)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer as HFTokenizer

from radixgate.runtime.model.model_config import ModelConfig
from radixgate.runtime.model.tokenizer import Tokenizer
from radixgate.runtime.model.tokenizer_gguf import END_MARKERS

_ARCHS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
_MODEL_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}


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
                              f"{cfg.get('model_type')}: Llama, Mistral and Qwen2 are supported")


def config_from_hf(cfg: dict, generation: dict | None = None) -> ModelConfig:
    """ModelConfig from config.json (transformers 4 ``rope_theta``/``rope_scaling`` or 5
    ``rope_parameters``)."""
    arch = _arch(cfg)
    if cfg.get("mlp_bias") or cfg.get("hidden_act", "silu") != "silu":
        raise NotImplementedError("only SwiGLU MLPs without bias are supported")
    heads = int(cfg["num_attention_heads"])
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
    kind = rope.get("rope_type", rope.get("type", "default"))
    scaling = None if kind in (None, "default") else {k: v for k, v in rope.items() if k != "rope_theta"}
    eos = _ids(cfg.get("eos_token_id")) + _ids((generation or {}).get("eos_token_id"))
    return ModelConfig(
        vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]), num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
        bos_token_id=None if cfg.get("bos_token_id") is None else int(cfg["bos_token_id"]),
        eos_token_ids=tuple(sorted(set(eos))), arch=arch)


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


def load_hf_dir(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer]:
    path = Path(path)
    config = read_hf_config(path)
    return config, weights_from_hf(path), tokenizer_from_hf(path, config)
