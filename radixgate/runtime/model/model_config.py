"""Model hyper-parameters as a frozen dataclass (no torch, no file access)."""
from __future__ import annotations

from dataclasses import dataclass, field

from radixgate.radix_cache.kv_dtypes import kv_bytes_per_token


@dataclass(frozen=True)
class ModelConfig:
    """Llama-family shape. ``rope_scaling`` follows HF's dict (``rope_type`` in
    ``default | linear | llama3``); ``eos_token_ids`` holds every id that ends generation."""

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

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    def kv_bytes_per_token(self, kv_dtype: str | int = 2) -> int:
        """K and V for one token across all layers, as ``kv_dtype`` (a ``[cache] kv_dtype``
        name, scales included, or bytes per number): radix_cache.kv_dtypes's formula."""
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, kv_dtype)

    @property
    def num_params(self) -> int:
        """Approximate parameter count (embeddings counted once when tied)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * h * self.intermediate_size
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attn + mlp + 2 * h) + emb + h
