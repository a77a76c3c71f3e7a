"""Load a Llama-family GGUF file: config from ``{arch}.*`` metadata and the weights with HF
names, left in the memory-mapped file (``GGUFWeight``): each is read when the model is built, as
integer codes (Q8_0 / Q4_0 / Q4_1 kept quantized) or dequantized, never the whole model at
once. Q/K rows are un-permuted on read (llama.cpp interleaves RoPE pairs for ``llama``)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as QT

from radixgate.runtime.model.model_config import ModelConfig
from radixgate.runtime.model.gguf_file import GGUFFile, TensorInfo
from radixgate.runtime.model.gguf_quants import BLOCK_LAYOUT, GroupCodes, dequantize, group_codes
from radixgate.runtime.model.tokenizer import Tokenizer
from radixgate.runtime.model.tokenizer_gguf import tokenizer_from_gguf

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2")
_PERMUTED_ARCHS = ("llama", "mistral")     # llama.cpp rotates these with interleaved pairs

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def _rope_scaling(meta: dict, arch: str) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling = {"rope_type": kind, "factor": float(meta.get(f"{arch}.rope.scaling.factor", 1.0))}
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def config_from_gguf(meta: dict, tensor_names=()) -> ModelConfig:
    arch = meta["general.architecture"]
    if arch not in SUPPORTED_ARCHS:
        raise NotImplementedError(f"GGUF architecture {arch!r} is not supported: {SUPPORTED_ARCHS}")
    g = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
    hidden, heads = int(g("embedding_length")), int(g("attention.head_count"))
    head_dim = int(g("attention.key_length", g("rope.dimension_count", hidden // heads)))
    vocab = g("vocab_size") or len(meta["tokenizer.ggml.tokens"])
    eos = meta.get("tokenizer.ggml.eos_token_id")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    return ModelConfig(
        vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(g("feed_forward_length")),
        num_layers=int(g("block_count")), num_heads=heads,
        num_kv_heads=int(g("attention.head_count_kv", heads)), head_dim=head_dim,
        rms_norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(g("rope.freq_base", 10000.0)), rope_scaling=_rope_scaling(meta, arch),
        max_position_embeddings=int(g("context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),), arch=arch)


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute``: per head, rows (pair i, half j) -> (half j, pair i).
    Works for weights [out, in] and biases [out]."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"
    return None


@dataclass(frozen=True)
class GGUFWeight:
    """One tensor of a GGUF file, still in the file (memory-mapped), in HF row order:
    ``rope_heads > 0`` un-permutes the rows of a Q/K projection of that many heads on read."""
    info: TensorInfo
    rope_heads: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.shape

    @property
    def qtype(self):
        return self.info.qtype

    def _rows_in_hf_order(self, w: np.ndarray) -> np.ndarray:
        return unpermute_rope_rows(w, self.rope_heads) if self.rope_heads else w

    def dense(self) -> np.ndarray:
        """float32 in HF layout."""
        w = np.ascontiguousarray(self._rows_in_hf_order(
            dequantize(self.info.data, self.info.qtype, self.info.shape)))
        return w if w.flags.writeable else w.copy()     # F32 tensors come back as file views

    def group_codes(self) -> GroupCodes:
        """Integer codes and group scales (Q8_0 / Q4_0 / Q4_1 only), rows in HF order."""
        codes = group_codes(self.info.data, self.info.qtype, self.info.shape)
        return GroupCodes(*(None if a is None else self._rows_in_hf_order(a) for a in codes))

    def q8_0_blocks(self) -> tuple[np.ndarray, np.ndarray] | None:
        """For a Q8_0 tensor [N, K] kept in file order: views of the file as its codes
        (int8 [N, K/32, 32]) and block scales (float16 [N, K/32, 1]), ``w = codes * scale``;
        None for any other type or a row-permuted tensor."""
        if self.info.qtype != QT.Q8_0 or self.rope_heads:
            return None
        rows, cols = self.info.shape
        _, type_size = BLOCK_LAYOUT[QT.Q8_0]
        blocks = np.asarray(self.info.data).view(np.uint8).reshape(rows, cols // 32, type_size)
        return blocks[:, :, 2:].view(np.int8), blocks[:, :, :2].view(np.float16)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids), K]: only those rows dequantized (an embedding lookup)."""
        block_elems, type_size = BLOCK_LAYOUT[self.info.qtype]
        rows, cols = self.info.shape
        raw = self.info.data.reshape(rows, cols // block_elems * type_size)[ids]
        return dequantize(raw, self.info.qtype, (len(ids), cols))


def _weight(gguf: GGUFFile, name: str, config: ModelConfig) -> GGUFWeight:
    heads = 0
    if config.arch in _PERMUTED_ARCHS and ".attn_q." in name:
        heads = config.num_heads
    elif config.arch in _PERMUTED_ARCHS and ".attn_k." in name:
        heads = config.num_kv_heads
    return GGUFWeight(gguf.tensors[name], heads)


def dequantize_tensor(gguf: GGUFFile, name: str, config: ModelConfig) -> np.ndarray:
    """One tensor as float32 in HF layout (Q/K rows un-permuted for llama-style archs)."""
    return _weight(gguf, name, config).dense()


def weights_from_gguf(gguf: GGUFFile, config: ModelConfig) -> dict[str, GGUFWeight]:
    """Every tensor the model uses, keyed by HF name, still in the (memory-mapped) file."""
    return {hf: _weight(gguf, name, config) for name in gguf.tensors
            if (hf := _hf_name(name)) is not None}


def read_gguf_weights(path) -> tuple[ModelConfig, dict[str, GGUFWeight]]:
    """Config and the weights left in the file (the tokenizer comes from ``tokenizer_from_gguf``)."""
    gguf = GGUFFile(path)
    config = config_from_gguf(gguf.metadata, gguf.tensors.keys())
    return config, weights_from_gguf(gguf, config)


def load_gguf(path) -> tuple[ModelConfig, dict[str, GGUFWeight], Tokenizer]:
    gguf = GGUFFile(path)
    config = config_from_gguf(gguf.metadata, gguf.tensors.keys())
    return config, weights_from_gguf(gguf, config), tokenizer_from_gguf(gguf.metadata)


def read_gguf_config(path) -> ModelConfig:
    """Config only (for the planner): reads metadata and tensor names, no weights."""
    gguf = GGUFFile(path)
    return config_from_gguf(gguf.metadata, gguf.tensors.keys())
