"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM) over the paged KV cache.

K/V are read and written only through ``radixgate.kernels``: each layer runs ``store_kv`` for
the new tokens, then ``paged_attention`` reads every key/value (new ones included) from the
cache. All T new tokens of a step go through each matmul together; logits are computed only
for ``batch.logits_indices``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from radixgate.kernels import attention_plan, paged_attention, store_kv
from radixgate.runtime.batch import ForwardBatch, build_forward_batch
from radixgate.runtime.config import ModelConfig
from radixgate.runtime.kv_cache import KVCache
from radixgate.runtime.linear import Linear
from radixgate.runtime.rope import apply_rope, rope_cos_sin, rope_inv_freq

__all__ = ["LlamaModel", "ForwardBatch", "build_forward_batch", "rms_norm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: normalise in fp32, cast back, scale."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


@dataclass
class DecoderLayer:
    attn_norm: torch.Tensor       # [H]
    qkv: torch.Tensor             # [(Hq + 2 Hkv) * D, H]  q, k, v projections stacked
    qkv_bias: torch.Tensor | None
    o_proj: torch.Tensor          # [H, Hq * D]
    mlp_norm: torch.Tensor        # [H]
    gate_up: torch.Tensor         # [2 I, H]  gate and up projections stacked
    down: torch.Tensor            # [H, I]
    proj: dict[str, Linear] = field(default_factory=dict, repr=False)  # the matmuls, prepacked

    def __post_init__(self):
        self.proj = {"qkv": Linear(self.qkv, self.qkv_bias), "o": Linear(self.o_proj),
                     "gate_up": Linear(self.gate_up), "down": Linear(self.down)}


class LlamaModel:
    """``LlamaModel(config, weights)``: ``weights`` uses HF names (``model.layers.0.self_attn.
    q_proj.weight`` ...) with HF's rotate_half Q/K layout; ``rope_freqs`` is optional."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor],
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
        self.config, self.device, self.dtype = config, torch.device(device), dtype
        take = lambda name: weights[name].to(device=self.device, dtype=dtype).contiguous()  # noqa: E731
        self.embed = take("model.embed_tokens.weight")                  # [V, H]
        self.norm = take("model.norm.weight")                           # [H]
        tied = config.tie_word_embeddings or "lm_head.weight" not in weights
        self.lm_head = self.embed if tied else take("lm_head.weight")   # [V, H]
        self.logits_proj = Linear(self.lm_head)
        self.layers = [self._layer(weights, i, take) for i in range(config.num_layers)]
        freq_factors = weights.get("rope_freqs")
        self.inv_freq = rope_inv_freq(config, freq_factors).to(self.device)   # [D/2] fp32
        self.scale = config.head_dim ** -0.5
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim

    def _layer(self, weights, i: int, take) -> DecoderLayer:
        p = f"model.layers.{i}."
        attn = [p + f"self_attn.{n}_proj" for n in "qkv"]
        bias = None
        if self.config.attention_bias or (attn[0] + ".bias") in weights:
            bias = torch.cat([take(a + ".bias") for a in attn])
        return DecoderLayer(
            attn_norm=take(p + "input_layernorm.weight"),
            qkv=torch.cat([take(a + ".weight") for a in attn]),
            qkv_bias=bias,
            o_proj=take(p + "self_attn.o_proj.weight"),
            mlp_norm=take(p + "post_attention_layernorm.weight"),
            gate_up=torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]),
            down=take(p + "mlp.down_proj.weight"))

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Run the new tokens of every sequence; returns float32 logits
        ``[len(batch.logits_indices), vocab]``. Writes their K/V into ``kv`` at
        ``batch.slot_mapping``."""
        x = self.embed[batch.input_ids]                                  # [T, H]
        cos, sin = rope_cos_sin(batch.positions, self.inv_freq, self.dtype)  # [T, 1, D]
        eps = self.config.rms_norm_eps
        plan = attention_plan(batch.block_tables, batch.cu_q_lens, batch.seq_lens, kv.block_size,
                              batch.num_tokens)                          # shared by every layer
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, eps)
            x = x + self._attention(layer, h, cos, sin, batch, plan, kv.k[i], kv.v[i])
            h = rms_norm(x, layer.mlp_norm, eps)
            x = x + self._mlp(layer, h)
        x = x[batch.logits_indices]                                      # [n, H]
        return self.logits_proj(rms_norm(x, self.norm, eps)).float()   # [n, V]

    __call__ = forward

    def _attention(self, layer: DecoderLayer, h, cos, sin, batch: ForwardBatch, plan,
                   k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        tokens = h.shape[0]
        qkv = layer.proj["qkv"](h)                                       # [T, (Hq + 2Hkv) D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(tokens, cfg.num_heads, cfg.head_dim), cos, sin)      # [T, Hq, D]
        k = apply_rope(k.view(tokens, cfg.num_kv_heads, cfg.head_dim), cos, sin)   # [T, Hkv, D]
        v = v.view(tokens, cfg.num_kv_heads, cfg.head_dim)                         # [T, Hkv, D]
        store_kv(k, v, k_cache, v_cache, batch.slot_mapping)
        out = paged_attention(q, k_cache, v_cache, batch.block_tables, batch.cu_q_lens,
                              batch.seq_lens, self.scale, plan=plan)     # [T, Hq, D]
        return layer.proj["o"](out.reshape(tokens, self.q_size))        # [T, H]

    def _mlp(self, layer: DecoderLayer, h: torch.Tensor) -> torch.Tensor:
        gate, up = layer.proj["gate_up"](h).chunk(2, dim=-1)             # [T, I] each
        return layer.proj["down"](F.silu(gate) * up)                     # [T, H]

    def num_parameters(self) -> int:
        tensors = [self.embed, self.norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        return sum(t.numel() for t in tensors)
