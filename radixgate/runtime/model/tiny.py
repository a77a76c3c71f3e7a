"""``--tiny``: a small random-weight Llama built in process (seeded), with the default
model's tokenizer, chat template and vocabulary, so tests tokenize real text fast."""
from __future__ import annotations

import torch

from radixgate.runtime.model.model_config import ModelConfig

TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=16)


def tiny_config(vocab_size: int, bos_token_id: int | None, eos_token_ids: tuple[int, ...],
                max_position_embeddings: int = 8192) -> ModelConfig:
    return ModelConfig(vocab_size=vocab_size, rms_norm_eps=1e-5, rope_theta=10000.0,
                       max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
                       bos_token_id=bos_token_id, eos_token_ids=eos_token_ids, arch="llama",
                       **TINY_SHAPE)


def tiny_weights(config: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random HF-named weights (std 0.02 for matrices, norms at 1), deterministic in ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    h, d = config.hidden_size, config.head_dim

    def matrix(rows: int, cols: int, std: float = 0.02) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) * std

    w = {"model.embed_tokens.weight": matrix(config.vocab_size, h, std=0.5),
         "model.norm.weight": torch.ones(h)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(h)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h)
        w[p + "self_attn.q_proj.weight"] = matrix(config.num_heads * d, h, std=0.2)
        w[p + "self_attn.k_proj.weight"] = matrix(config.num_kv_heads * d, h, std=0.2)
        w[p + "self_attn.v_proj.weight"] = matrix(config.num_kv_heads * d, h, std=0.2)
        w[p + "self_attn.o_proj.weight"] = matrix(h, config.num_heads * d, std=0.1)
        w[p + "mlp.gate_proj.weight"] = matrix(config.intermediate_size, h, std=0.1)
        w[p + "mlp.up_proj.weight"] = matrix(config.intermediate_size, h, std=0.1)
        w[p + "mlp.down_proj.weight"] = matrix(h, config.intermediate_size, std=0.1)
    return w
