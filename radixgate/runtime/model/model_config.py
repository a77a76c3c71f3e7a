"""Model hyper-parameters as a frozen dataclass (no torch, no file access)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from radixgate.kv.dtypes import kv_bytes_per_token


@dataclass(frozen=True)
class ModelConfig:
    """Decoder shape for the Llama family and its relatives (Mistral, Qwen2/3, Gemma 2/3,
    Phi-3). ``rope_scaling`` follows HF's dict (``rope_type`` in ``default | linear | llama3 |
    longrope``; longrope carries ``short_factor``, ``long_factor``,
    ``original_max_position_embeddings`` and ``attention_factor``); ``eos_token_ids`` holds
    every id that ends generation.

    The relatives' features, each off by default (a plain Llama):
    - ``qk_norm``: an RMSNorm over each q and k head before rope (Qwen3, Gemma 3; weights
      ``self_attn.q_norm.weight`` / ``k_norm``).
    - ``layer_windows``: per layer, the sliding attention window in tokens (a query at
      position p sees keys p - W + 1 ... p), 0 for a global layer; empty: all global.
    - ``attn_softcap`` / ``final_softcap``: ``cap * tanh(x / cap)`` on the attention scores
      / the logits (Gemma 2), 0 for none.
    - ``query_scale``: the attention scale (Gemma's ``query_pre_attn_scalar ** -0.5``); 0
      means ``head_dim ** -0.5``.
    - ``hidden_act``: ``silu`` (SwiGLU) or ``gelu_tanh`` (GeGLU, Gemma).
    - ``embed_scale``: the embeddings are multiplied by it (Gemma: sqrt(hidden_size)).
    - ``sandwich_norms``: Gemma 2/3's four norms per layer (``post_attention_layernorm`` on
      the attention output, ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm``
      around the MLP). Norm weights are always held as the multiplier itself: Gemma's
      ``1 + w`` is folded in when a checkpoint is loaded.
    - ``rope_local_theta``: the rope base of the window layers (Gemma 3), which use no
      scaling; 0: the same rope as the global layers."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    arch: str = "llama"
    qk_norm: bool = False
    layer_windows: tuple[int, ...] = ()
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    query_scale: float = 0.0
    hidden_act: str = "silu"
    embed_scale: float = 1.0
    sandwich_norms: bool = False
    rope_local_theta: float = 0.0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.layer_windows and len(self.layer_windows) != self.num_layers:
            raise ValueError(f"layer_windows has {len(self.layer_windows)} entries for "
                             f"{self.num_layers} layers")
        if self.hidden_act not in ("silu", "gelu_tanh"):
            raise ValueError(f"hidden_act {self.hidden_act!r}: silu or gelu_tanh")

    def window(self, layer: int) -> int:
        """Layer ``layer``'s sliding window in tokens, 0 for a global layer."""
        return self.layer_windows[layer] if self.layer_windows else 0

    @property
    def plain_llama(self) -> bool:
        """No relative's feature on: the layer the fused and deterministic paths cover."""
        return not (self.sandwich_norms or self.qk_norm or self.layer_windows
                    or self.attn_softcap or self.final_softcap or self.embed_scale != 1.0
                    or self.hidden_act != "silu")

    @property
    def attention_scale(self) -> float:
        return self.query_scale or self.head_dim ** -0.5

    def kv_bytes_per_token(self, kv_dtype: str | int = 2) -> int:
        """K and V for one token across all layers, as ``kv_dtype`` (a ``[cache] kv_dtype``
        name, scales included, or bytes per number): kv.dtypes's formula."""
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, kv_dtype)

    @property
    def num_params(self) -> int:
        """Approximate parameter count (embeddings counted once when tied)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        attn += 2 * d if self.qk_norm else 0
        mlp = 3 * h * self.intermediate_size + (2 * h if self.sandwich_norms else 0)
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attn + mlp + 2 * h) + emb + h


def longrope_default_attention_factor(factor: float, original: int) -> float:
    """HF's longrope attention factor where a checkpoint gives none: sqrt(1 + ln(factor) /
    ln(original)) for a context ``factor`` times the original one, 1 when not longer."""
    return math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0
