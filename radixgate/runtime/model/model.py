"""Llama-family decoder (Llama, Mistral, Qwen2/3, SmolLM, Gemma 2/3, Phi-3) over the paged KV
cache. The relatives' features are ``ModelConfig``'s (q/k norms, sliding windows, soft-caps,
GeGLU, scaled embeddings, Gemma's four norms per layer, a local rope base, longrope); a layer
with a window or soft-capped scores attends through ``kernels.window_attention``.

K/V are read and written only through ``radixgate.kernels``: each layer runs ``store_kv`` for
the new tokens, then ``paged_attention`` reads every key/value (new ones included) from the
cache. All T new tokens of a step go through each matmul together; logits are computed only
for ``batch.logits_indices``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from radixgate.kernels import (attention_plan, native, paged_attention, store_kv, uses_triton,
                               window_attention)
from radixgate.runtime.model.batch import ForwardBatch, build_forward_batch
from radixgate.runtime.model.model_config import ModelConfig
from radixgate.runtime.model.kv_cache import KVCache
from radixgate.runtime.model.linear import Linear
from radixgate.runtime.model.rope import (apply_rope, local_rope_inv_freq, rope_attention_factor,
                                          RopeTable, rope_inv_freq)
from radixgate.runtime.model.weights import build_embedding_and_head, build_linear, dense

__all__ = ["LlamaModel", "ForwardBatch", "build_forward_batch", "rms_norm"]


NATIVE_ROPE_STORE = True     # rope + K/V store through kernels.native (float32 and int8 caches)
NATIVE_RAGGED = True         # every mode's attention through native.ragged_attention where it fits
NATIVE_SILU_MAX_ROWS = 16    # one thread: past that torch's two-thread silu wins (Ice Lake,
                             # with torch's own vectorized exp: 16 rows 41 vs 50 us, 64 150 vs 92)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: normalise in fp32, cast back, scale (float32: torch's fused op). A
    float32 ``weight`` on lower-precision ``x`` is Gemma's norm: scaled in fp32, then cast
    (its ``1 + w`` multiplier is kept in float32: in bf16 a small w would round away)."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return torch.rms_norm(x, weight.shape, weight, eps)
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight.dtype == torch.float32:
        return (x32 * weight).to(x.dtype)
    return weight * x32.to(x.dtype)


@dataclass
class DecoderLayer:
    attn_norm: torch.Tensor       # [H]
    qkv: Linear                   # [(Hq + 2 Hkv) * D, H]  q, k, v projections stacked
    o_proj: Linear                # [H, Hq * D]
    mlp_norm: torch.Tensor        # [H]
    gate_up: Linear               # [2 I, H]  gate and up projections stacked
    down: Linear                  # [H, I]
    q_norm: torch.Tensor | None = None        # [D] per q head before rope (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None        # [D] per k head
    attn_out_norm: torch.Tensor | None = None  # [H] on the attention output (Gemma)
    mlp_out_norm: torch.Tensor | None = None   # [H] on the MLP output (Gemma)
    window: int = 0                           # sliding window in tokens, 0: global


class LlamaModel:
    """``LlamaModel(config, weights)``: ``weights`` uses HF names (``model.layers.0.self_attn.
    q_proj.weight`` ...) with HF's rotate_half Q/K layout; ``rope_freqs`` is optional. Values
    are tensors or ``GGUFWeight``s (radixgate/runtime/model/weights.py); matmul weights are built in
    ``weights_dtype`` (float32 | bfloat16 | int8 | int4, see radixgate/runtime/model/linear.py), activations
    stay in ``dtype``."""

    def __init__(self, config: ModelConfig, weights: dict, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, weights_dtype: str = "float32"):
        self.config, self.device, self.dtype = config, torch.device(device), dtype
        self.weights_dtype = weights_dtype
        self.norm = self._norm_vector(weights["model.norm.weight"])      # [H]
        tied = config.tie_word_embeddings or "lm_head.weight" not in weights
        self.tied = tied
        self.embed, self.logits_proj = build_embedding_and_head(
            weights["model.embed_tokens.weight"], None if tied else weights["lm_head.weight"],
            weights_dtype, self.device, dtype)                           # [V, H] each
        self.layers = [self._layer(weights, i) for i in range(config.num_layers)]
        freq_factors = weights.get("rope_freqs")
        if freq_factors is not None:
            freq_factors = dense(freq_factors)
        self.inv_freq = rope_inv_freq(config, freq_factors).to(self.device)   # [D/2] fp32
        local = local_rope_inv_freq(config)                  # the window layers' own, or None
        self.local_inv_freq = None if local is None else local.to(self.device)
        self.rope_factor = rope_attention_factor(config)
        self.rope_table = RopeTable(self.inv_freq, self.rope_factor)            # [T] -> cos, sin
        self.local_rope_table = None if self.local_inv_freq is None else RopeTable(
            self.local_inv_freq)
        self.scale = config.attention_scale
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        # residual add + norm in one native call where the norms are float32 on the CPU
        self.fused_norms = not config.sandwich_norms and native.usable(
            *(w for layer in self.layers for w in (layer.attn_norm, layer.mlp_norm)))
        # the fused norms write what the layers' qkv and gate_up cast their input to
        inputs = {m.input_dtype for layer in self.layers for m in (layer.qkv, layer.gate_up)}
        self.norm_out_dtype = inputs.pop() if len(inputs) == 1 and inputs <= {
            torch.float32, torch.bfloat16} else torch.float32

    def check_deterministic(self) -> None:
        """Raise ValueError where deterministic steps cannot hold (``ForwardBatch.deterministic``,
        docs/ARCHITECTURE.md section 5c): no native kernels, activations not float32 on the CPU."""
        if not self.config.plain_llama:
            raise ValueError(f"deterministic mode covers the Llama/Qwen2 layer only, not "
                             f"{self.config.arch}'s (windows, soft-caps, extra norms)")
        head_dim = self.config.head_dim
        if not native.attention_takes_head_dim(head_dim):
            raise ValueError(f"deterministic mode's attention kernel takes head dims that are "
                             f"multiples of 16 up to 256, not {head_dim}")
        if not (native.usable() and self.device.type == "cpu" and self.dtype == torch.float32
                and self.fused_norms):
            raise ValueError("deterministic mode needs the native CPU kernels (a C compiler, "
                             "RADIXGATE_NATIVE not 0) and float32 activations on the CPU")

    def _vector(self, source) -> torch.Tensor:
        return dense(source).to(device=self.device, dtype=self.dtype).contiguous()

    def _norm_vector(self, source) -> torch.Tensor:
        """A norm weight: in the activations' dtype, or float32 for Gemma (``rms_norm``)."""
        if not self.config.sandwich_norms:
            return self._vector(source)
        return dense(source).to(device=self.device, dtype=torch.float32).contiguous()

    def _linear(self, parts, bias=None) -> Linear:
        return build_linear(parts, self.weights_dtype, self.device, bias)

    def _layer(self, weights, i: int) -> DecoderLayer:
        """Layer i from HF names; Phi-3's fused ``qkv_proj`` / ``gate_up_proj`` are taken as
        they are (the same stacking as ours)."""
        p, cfg = f"model.layers.{i}.", self.config
        attn = [p + f"self_attn.{n}_proj" for n in "qkv"]
        bias = None
        if cfg.attention_bias or (attn[0] + ".bias") in weights:
            bias = torch.cat([self._vector(weights[a + ".bias"]) for a in attn])
        qkv = [weights[p + "self_attn.qkv_proj.weight"]] if p + "self_attn.qkv_proj.weight" \
            in weights else [weights[a + ".weight"] for a in attn]
        gate_up = [weights[p + "mlp.gate_up_proj.weight"]] if p + "mlp.gate_up_proj.weight" \
            in weights else [weights[p + "mlp.gate_proj.weight"], weights[p + "mlp.up_proj.weight"]]
        sandwich = cfg.sandwich_norms

        def norm(name: str, wanted: bool = True) -> torch.Tensor | None:
            return self._norm_vector(weights[p + name]) if wanted else None

        o_bias = weights.get(p + "self_attn.o_proj.bias")
        return DecoderLayer(
            attn_norm=norm("input_layernorm.weight"),
            qkv=self._linear(qkv, bias),
            o_proj=self._linear([weights[p + "self_attn.o_proj.weight"]],
                                None if o_bias is None else self._vector(o_bias)),
            mlp_norm=norm("pre_feedforward_layernorm.weight" if sandwich
                          else "post_attention_layernorm.weight"),
            gate_up=self._linear(gate_up),
            down=self._linear([weights[p + "mlp.down_proj.weight"]]),
            q_norm=norm("self_attn.q_norm.weight", cfg.qk_norm),
            k_norm=norm("self_attn.k_norm.weight", cfg.qk_norm),
            attn_out_norm=norm("post_attention_layernorm.weight", sandwich),
            mlp_out_norm=norm("post_feedforward_layernorm.weight", sandwich),
            window=cfg.window(i))

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Run the new tokens of every sequence; returns float32 logits
        ``[len(batch.logits_indices), vocab]``. Writes their K/V into ``kv`` at
        ``batch.slot_mapping``.

        ``batch.deterministic``: position t computes the same bits however the step was made
        up (rows beside it, chunk sizes, decode or prefill, thread count, KV dtype): every
        matmul row-invariant (``native(x, invariant=True)``, radixgate/runtime/model/linear.py), every
        sequence's attention through ``kernels.native.ragged_attention`` (every KV dtype read in
        place), rope always in the native kernel, the norms
        native (``check_deterministic`` says where that cannot hold)."""
        x = self.embed(batch.input_ids)                                  # [T, H]
        if self.config.embed_scale != 1.0:                               # HF: in x's dtype
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        cos, sin = self.rope_table(batch.positions, self.dtype)         # [T, 1, D]
        local = None if self.local_rope_table is None else self.local_rope_table(
            batch.positions, self.dtype)                                  # window layers' rope
        eps = self.config.rms_norm_eps
        plan = attention_plan(batch.block_tables, batch.cu_q_lens, batch.seq_lens, kv.block_size,
                              batch.num_tokens, quantized=kv.quantized,
                              deterministic=batch.deterministic or self._ragged_reads(kv, x))
        rope_native = NATIVE_ROPE_STORE and kv.k[0].dtype in native.ROPE_STORE_DTYPES \
            and not uses_triton(kv.k[0]) and native.usable(cos, sin)   # decided once: every layer alike
        layer_args = ((cos, sin), local, self._window_batch(batch, kv), plan, kv, rope_native)
        if self.fused_norms and native.usable(x):
            x = self._layers_fused(x, eps, layer_args)
        else:
            x = self._layers(x, eps, layer_args)
        x = x[batch.logits_indices]                                      # [n, H]
        det = batch.deterministic
        if self.fused_norms and native.usable(x, self.norm):
            h = native.add_rms_norm(x, None, self.norm, eps)
        else:
            h = rms_norm(x, self.norm, eps)
        logits = (self.logits_proj.native(h, True) if det else self.logits_proj(h)).float()
        cap = self.config.final_softcap
        return torch.tanh(logits / cap) * cap if cap else logits

    __call__ = forward

    @staticmethod
    def _window_batch(batch: ForwardBatch, kv: KVCache) -> tuple[ForwardBatch, ForwardBatch]:
        """(the global layers' batch, the window layers'): the same unless the window layers
        have a pool of their own (``KVCache.window``), whose tables and slots differ."""
        if kv.window is None:
            return batch, batch
        tables, slots = kv.window_view(batch.block_tables, batch.slot_mapping)
        return batch, replace(batch, block_tables=tables, slot_mapping=slots, slot_bounds=None)

    def _layers(self, x: torch.Tensor, eps: float, layer_args) -> torch.Tensor:
        """The decoder layers in torch ops; residual adds promote bf16 outputs to x's dtype."""
        det = layer_args[2][0].deterministic
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, eps)
            out = self._attention(layer, h, i, *layer_args)
            if layer.attn_out_norm is not None:
                out = rms_norm(out, layer.attn_out_norm, eps)
            x = x + out
            h = rms_norm(x, layer.mlp_norm, eps)
            out = self._mlp(layer, h, det)
            if layer.mlp_out_norm is not None:
                out = rms_norm(out, layer.mlp_out_norm, eps)
            x = x + out
        return x

    def _layers_fused(self, x: torch.Tensor, eps: float, layer_args) -> torch.Tensor:
        """The same layers with each residual add and the norm after it in one native call
        (``kernels.native.add_rms_norm``, x updated in place: it is this forward's own
        embedding output), the norm written in the dtype the next matmul casts it to (the
        same bits as that cast); the last add has no norm after it (the final norm runs on
        the logits rows only)."""
        layers, out = self.layers, self.norm_out_dtype
        det = layer_args[2][0].deterministic
        h = native.add_rms_norm(x, None, layers[0].attn_norm, eps, out)
        for i, layer in enumerate(layers):
            h = native.add_rms_norm(x, self._attention(layer, h, i, *layer_args),
                                    layer.mlp_norm, eps, out)
            after = layers[i + 1].attn_norm if i + 1 < len(layers) else None
            h = native.add_rms_norm(x, self._mlp(layer, h, det), after, eps, out)
        return x

    @staticmethod
    def _ragged_reads(kv: KVCache, x: torch.Tensor) -> bool:
        """A CPU cache goes through the native ragged kernel in either mode where it takes the
        head dim: it reads every KV dtype in place (torch's path gathers and dequantizes every
        position each layer: int8 at 4k context 5x slower) and beats the default mode's other
        kernels too (benchmarks/RESULTS.md, issue 49: float32 decode at 4k 20.5 against 27.9
        ms a step, a 2k prefill's attention 760 against SDPA's 796)."""
        return NATIVE_RAGGED and not uses_triton(kv.k[0]) and native.usable(x) \
            and native.attention_takes_head_dim(kv.head_dim)

    def _attention(self, layer: DecoderLayer, h, i: int, rope, local_rope, batches,
                   plan, kv: KVCache, rope_native: bool) -> torch.Tensor:
        """Layer ``i``'s attention block: qkv, q/k norms, rope, K/V stored, paged attention,
        o_proj (``rope_native``: this forward's rope and store go through
        ``native.rope_store``; ``local_rope``: the window layers' own cos/sin, or None;
        ``batches``: the global and the window layers' views of the step)."""
        cfg = self.config
        batch = batches[1] if i in kv.window_layers else batches[0]
        k_cache, v_cache, scales = kv.k[i], kv.v[i], kv.layer_scales(i)
        tokens = h.shape[0]
        cos, sin = local_rope if layer.window and local_rope is not None else rope
        qkv = layer.qkv.native(h, batch.deterministic)   # [T, (Hq + 2Hkv) D]: bf16 products, or float32
        if layer.q_norm is not None:
            qkv = self._qk_norms(layer, qkv)
        if rope_native and qkv.dtype in (torch.float32, torch.bfloat16) and qkv.is_contiguous():
            q = native.rope_store(qkv, cos, sin, batch.slot_mapping, k_cache, v_cache,
                                  cfg.num_heads, **scales)       # one pass: rope, K/V stored
        elif batch.deterministic:
            q = self._rope_native_then_store(qkv, cos, sin, batch, k_cache, v_cache, scales)
        else:
            q = self._rope_and_store(qkv, cos, sin, batch, k_cache, v_cache, scales)
        if layer.window or cfg.attn_softcap:
            out = window_attention(q, k_cache, v_cache, batch.block_tables, batch.cu_q_lens,
                                   batch.seq_lens, self.scale, window=layer.window,
                                   softcap=cfg.attn_softcap, **scales)
        else:
            out = paged_attention(q, k_cache, v_cache, batch.block_tables, batch.cu_q_lens,
                                  batch.seq_lens, self.scale, plan=plan, **scales)  # [T, Hq, D]
        return layer.o_proj.native(out.reshape(tokens, self.q_size), batch.deterministic)

    def _qk_norms(self, layer: DecoderLayer, qkv: torch.Tensor) -> torch.Tensor:
        """q and k heads each through their RMSNorm (before rope, as HF's Qwen3 / Gemma 3)."""
        cfg, tokens = self.config, qkv.shape[0]
        qkv = qkv.to(self.dtype)
        eps, d = cfg.rms_norm_eps, cfg.head_dim
        q = rms_norm(qkv[:, :self.q_size].reshape(tokens, cfg.num_heads, d), layer.q_norm, eps)
        k = rms_norm(qkv[:, self.q_size:self.q_size + self.kv_size].reshape(
            tokens, cfg.num_kv_heads, d), layer.k_norm, eps)
        return torch.cat([q.reshape(tokens, -1), k.reshape(tokens, -1),
                          qkv[:, self.q_size + self.kv_size:]], dim=1)

    def _rope_and_store(self, qkv, cos, sin, batch: ForwardBatch, k_cache, v_cache,
                        scales: dict) -> torch.Tensor:
        """q rotated [T, Hq, D]; k rotated and v stored in the layer's caches (torch ops)."""
        cfg = self.config
        tokens = qkv.shape[0]
        qkv = qkv.to(self.dtype)                  # bf16 products widen exactly
        qk_size = self.q_size + self.kv_size                     # slices: Tensor.split costs more
        heads = cfg.num_heads + cfg.num_kv_heads                 # q and k rotated in one pass
        qk = apply_rope(qkv[:, :qk_size].view(tokens, heads, cfg.head_dim), cos, sin)  # [T, Hq + Hkv, D]
        q, k = qk[:, :cfg.num_heads], qk[:, cfg.num_heads:]      # [T, Hq, D], [T, Hkv, D]
        v = qkv[:, qk_size:].view(tokens, cfg.num_kv_heads, cfg.head_dim)         # [T, Hkv, D]
        store_kv(k, v, k_cache, v_cache, batch.slot_mapping, slot_bounds=batch.slot_bounds,
                 **scales)
        return q

    def _rope_native_then_store(self, qkv, cos, sin, batch: ForwardBatch, k_cache, v_cache,
                                scales: dict) -> torch.Tensor:
        """Deterministic mode over a cache that is not float32: the native rope (the same
        arithmetic as for a float32 cache) into float32 K/V, then ``store_kv`` rounds or
        quantizes them (elementwise: the same bits for a token in any step)."""
        cfg, tokens = self.config, qkv.shape[0]
        k = torch.empty((tokens, 1, cfg.num_kv_heads, cfg.head_dim), dtype=torch.float32)
        v = torch.empty_like(k)
        slots = torch.arange(tokens, dtype=torch.int64)
        q = native.rope_store(qkv.contiguous(), cos.contiguous(), sin.contiguous(), slots, k, v,
                              cfg.num_heads)
        store_kv(k[:, 0], v[:, 0], k_cache, v_cache, batch.slot_mapping,
                 slot_bounds=batch.slot_bounds, **scales)
        return q

    def _mlp(self, layer: DecoderLayer, h: torch.Tensor, det: bool = False) -> torch.Tensor:
        """In the matmuls' own dtype (bf16 for quantized weights): down takes bf16 anyway.
        (The native silu and torch's round alike, and torch's is row-invariant: ``det``
        only reaches the matmuls.)"""
        gate_up = layer.gate_up.native(h, det)                   # [T, 2I]
        if self.config.hidden_act == "gelu_tanh":                # GeGLU (Gemma)
            half = gate_up.shape[-1] // 2
            return layer.down.native(F.gelu(gate_up[:, :half], approximate="tanh")
                                     * gate_up[:, half:], det)
        if gate_up.shape[0] <= NATIVE_SILU_MAX_ROWS and gate_up.dtype == torch.bfloat16 \
                and gate_up.is_contiguous() and native.usable():
            return layer.down.native(native.silu_mul(gate_up), det)  # torch's bf16 roundings
        half = gate_up.shape[-1] // 2
        gate, up = gate_up[:, :half], gate_up[:, half:]          # [T, I] each
        return layer.down.native(F.silu(gate) * up, det)         # [T, H]

    def num_parameters(self) -> int:
        matmuls = [self.logits_proj] + [m for layer in self.layers
                                        for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
        count = sum(m.shape[0] * m.shape[1] for m in matmuls) + self.norm.numel()
        if not self.tied:
            count += self.embed.shape[0] * self.embed.shape[1]
        norms = [w for layer in self.layers for w in (layer.attn_norm, layer.mlp_norm, layer.q_norm,
                                                       layer.k_norm, layer.attn_out_norm,
                                                       layer.mlp_out_norm) if w is not None]
        return count + sum(w.numel() for w in norms)

    def weight_bytes(self) -> int:
        """Bytes of the matmul weights as held in memory (a file-backed embedding excluded)."""
        matmuls = [self.logits_proj] + [m for layer in self.layers
                                        for m in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
        return sum(m.nbytes for m in matmuls)
