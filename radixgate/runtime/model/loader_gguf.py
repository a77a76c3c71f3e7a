"""Load a Llama-family GGUF file: config from ``{arch}.*`` metadata and the weights with HF
names, left in the memory-mapped file (``GGUFWeight``): each is read when the model is built, as
integer codes (Q8_0 / Q4_0 / Q4_1 kept quantized) or dequantized, never the whole model at
once. Q/K rows are un-permuted on read (llama.cpp interleaves RoPE pairs for ``llama``; the
NEOX-rope archs qwen2/3, gemma2/3 and phi3 are written in HF order).

Archs: ``llama`` (Llama, and Mistral: HF's MistralForCausalLM converts to ``llama``),
``mistral``, ``qwen2``, ``qwen3``, ``gemma2``, ``gemma3`` (text) and ``phi3``, as llama.cpp's
``convert_hf_to_gguf.py`` writes them. Gemma's norm weights are stored by the converter as
``1 + w`` (the multiplier), which is what the model holds; Phi-3's fused ``attn_qkv`` /
``ffn_up`` keep HF's fused names ``qkv_proj`` / ``gate_up_proj``."""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as QT

from radixgate.runtime.model.model_config import ModelConfig, longrope_default_attention_factor
from radixgate.runtime.model.gguf_file import GGUFFile, TensorInfo
from radixgate.runtime.model.gguf_quants import BLOCK_LAYOUT, GroupCodes, dequantize, group_codes
from radixgate.runtime.model.tokenizer import Tokenizer
from radixgate.runtime.model.tokenizer_gguf import tokenizer_from_gguf

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
_PERMUTED_ARCHS = ("llama", "mistral")     # llama.cpp rotates these with interleaved pairs
_GEMMA = ("gemma2", "gemma3")
# llama.cpp's defaults where a gemma file lacks the key (src/models/gemma2.cpp, gemma3.cpp)
_DEFAULT_WINDOW = {"gemma2": 4096}
_DEFAULT_SWA_PATTERN = {"gemma2": 2, "gemma3": 6}      # every n-th layer global, the rest windowed
_DEFAULT_LOCAL_THETA = {"gemma3": 10000.0}
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}       # scale by hidden / heads, not head_dim

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",
}
# read into the config (Phi-3's longrope ``rope_scaling``), not weights
_CONFIG_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GEMMA_LAYER_NAMES = {**_LAYER_NAMES, "post_attention_norm": "post_attention_layernorm",
                      "ffn_norm": "pre_feedforward_layernorm",
                      "post_ffw_norm": "post_feedforward_layernorm"}
_ARCH_LAYER_NAMES = {
    "gemma2": _GEMMA_LAYER_NAMES, "gemma3": _GEMMA_LAYER_NAMES,
    # fused as in HF's Phi3: qkv_proj = [q; k; v], gate_up_proj = [gate; up]
    "phi3": {**_LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def _decimal(x) -> float:
    """A float32 from the file as the decimal it was written from (1e-06, not
    9.99999997e-07): the shortest repr of the float32, so configs compare equal with HF's."""
    x = float(x)
    return float(str(np.float32(x))) if float(np.float32(x)) == x else x


def _rope_scaling(meta: dict, arch: str) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = _decimal(meta.get(f"{arch}.rope.scaling.factor", 1.0))
    scaling = {"rope_type": kind, "factor": factor}
    original = meta.get(f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def _longrope(meta: dict, arch: str, tensors) -> dict | None:
    """Phi-3's LongRoPE as HF's ``rope_scaling``: the converter writes the per-frequency
    factors as the tensors ``rope_factors_{short,long}.weight`` and no ``rope.scaling.type``;
    ``attention_factor`` is its ``rope.scaling.attn_factor`` (HF's default formula if absent)."""
    present = [name for name in _CONFIG_TENSORS if name in tensors]
    if not present:
        return None
    if len(present) != 2:
        raise ValueError(f"a LongRoPE GGUF needs both {_CONFIG_TENSORS}, found {present}")
    if not isinstance(tensors, Mapping):
        raise ValueError("the LongRoPE factors are tensors: pass config_from_gguf the "
                         "name -> TensorInfo mapping (GGUFFile.tensors), not only names")
    long_f, short_f = (dequantize(tensors[n].data, tensors[n].qtype, tensors[n].shape)
                       for n in _CONFIG_TENSORS)
    max_pos = int(meta[f"{arch}.context_length"])
    original = int(meta.get(f"{arch}.rope.scaling.original_context_length", max_pos))
    factor = meta.get(f"{arch}.rope.scaling.attn_factor")
    if factor is None:      # transformers' _compute_longrope_parameters default
        factor = longrope_default_attention_factor(max_pos / original, original)
    return {"rope_type": "longrope", "short_factor": [_decimal(x) for x in short_f],
            "long_factor": [_decimal(x) for x in long_f],
            "original_max_position_embeddings": original, "attention_factor": _decimal(factor)}


def _layer_windows(meta: dict, arch: str, num_layers: int) -> tuple[int, ...]:
    """Per layer the sliding window (0: global), as llama.cpp reads it: ``attention.
    sliding_window`` (gemma2 defaults to 4096 without it); Gemma's layer pattern from
    ``attention.sliding_window_pattern`` (a period n: layer i windowed iff i % n < n - 1, or
    a per-layer bool array), by default 2 (gemma2: layer 0 windowed) / 6 (gemma3: every 6th
    global). Other archs window every layer (HF's Mistral / Phi-3 ``sliding_window``)."""
    window = int(meta.get(f"{arch}.attention.sliding_window", _DEFAULT_WINDOW.get(arch, 0)) or 0)
    if window <= 0:
        return ()
    if arch in _GEMMA:
        pattern = meta.get(f"{arch}.attention.sliding_window_pattern", _DEFAULT_SWA_PATTERN[arch])
        if isinstance(pattern, (list, tuple, np.ndarray)):
            windowed = [bool(x) for x in pattern]
            if len(windowed) != num_layers:
                raise ValueError(f"{arch}.attention.sliding_window_pattern has {len(windowed)} "
                                 f"entries for {num_layers} layers")
        else:
            n = int(pattern)
            windowed = [n == 0 or i % n < n - 1 for i in range(num_layers)]
    else:
        windowed = [True] * num_layers
    windows = tuple(window if w else 0 for w in windowed)
    return windows if any(windows) else ()


def config_from_gguf(meta: dict, tensors=()) -> ModelConfig:
    """The config from a GGUF's metadata and its tensors: their names, or (for Phi-3's
    LongRoPE factors, which are tensors) the name -> TensorInfo mapping ``GGUFFile.tensors``."""
    arch = meta["general.architecture"]
    if arch not in SUPPORTED_ARCHS:
        raise NotImplementedError(f"GGUF architecture {arch!r} is not supported: {SUPPORTED_ARCHS}")
    g = lambda key, default=None: meta.get(f"{arch}.{key}", default)  # noqa: E731
    hidden, heads = int(g("embedding_length")), int(g("attention.head_count"))
    num_layers = int(g("block_count"))
    head_dim = int(g("attention.key_length", hidden // heads))
    rope_dim = int(g("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise NotImplementedError(f"{arch}: rope over {rope_dim} of {head_dim} head dims "
                                  "(partial rotary) is not supported")
    vocab = g("vocab_size") or len(meta["tokenizer.ggml.tokens"])
    eos = meta.get("tokenizer.ggml.eos_token_id")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    gemma = arch in _GEMMA
    windows = _layer_windows(meta, arch, num_layers)
    local_theta = g("rope.freq_base_swa", _DEFAULT_LOCAL_THETA.get(arch)) \
        if windows and arch in _DEFAULT_LOCAL_THETA else None           # gemma3's alone
    # llama.cpp scales Gemma's queries by head_dim ** -0.5, except the 27B models (by layer
    # count) by (hidden / heads) ** -0.5: HF's query_pre_attn_scalar, which no key carries.
    query_scale = 0.0
    if gemma:
        big = _GEMMA_27B_LAYERS[arch] == num_layers
        query_scale = float(hidden // heads if big else head_dim) ** -0.5
    return ModelConfig(
        vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(g("feed_forward_length")),
        num_layers=num_layers, num_heads=heads,
        num_kv_heads=int(g("attention.head_count_kv", heads)), head_dim=head_dim,
        rms_norm_eps=_decimal(g("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=_decimal(g("rope.freq_base", 10000.0)),
        rope_scaling=_longrope(meta, arch, tensors) or _rope_scaling(meta, arch),
        max_position_embeddings=int(g("context_length", 2048)),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors or "blk.0.attn_qkv.bias" in tensors,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),), arch=arch,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        layer_windows=windows,
        # gemma2 always soft-caps in llama.cpp (50 / 30 without the keys); gemma3 at most logits
        attn_softcap=_decimal(g("attn_logit_softcapping", 50.0 if arch == "gemma2" else 0.0)),
        final_softcap=_decimal(g("final_logit_softcapping", 30.0 if arch == "gemma2" else 0.0)),
        query_scale=query_scale,
        hidden_act="gelu_tanh" if gemma else "silu",
        embed_scale=float(hidden) ** 0.5 if gemma else 1.0,      # as loader_hf
        sandwich_norms=gemma,
        rope_local_theta=_decimal(local_theta or 0.0))


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's ``permute``: per head, rows (pair i, half j) -> (half j, pair i).
    Works for weights [out, in] and biases [out]."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_name(name: str, arch: str = "llama") -> str | None:
    """The HF name of a GGUF tensor of ``arch``; None for one it has no use for."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    names = _ARCH_LAYER_NAMES.get(arch, _LAYER_NAMES)
    m = _LAYER_RE.match(name)
    if m and m.group(2) in names:
        return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"
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

    def q4_blocks(self) -> np.ndarray | None:
        """A Q4_0 / Q4_1 tensor [N, K]'s raw blocks, uint8 [N, K/32, 18 or 20], rows in HF
        order (a view of the file where no rows move); None for any other type."""
        if self.info.qtype not in (QT.Q4_0, QT.Q4_1):
            return None
        rows, cols = self.info.shape
        _, type_size = BLOCK_LAYOUT[self.info.qtype]
        blocks = np.asarray(self.info.data).view(np.uint8).reshape(rows, cols // 32, type_size)
        return self._rows_in_hf_order(blocks)

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
    """Every tensor the model uses, keyed by HF name, still in the (memory-mapped) file. A
    tensor with no HF name (and not read into the config) is an error, not dropped."""
    weights, unknown = {}, []
    for name in gguf.tensors:
        if (hf := _hf_name(name, config.arch)) is not None:
            weights[hf] = _weight(gguf, name, config)
        elif name not in _CONFIG_TENSORS:
            unknown.append(name)
    if unknown:
        raise NotImplementedError(f"{config.arch} GGUF tensors with no HF name: {unknown[:8]}")
    return weights


def read_gguf_weights(path) -> tuple[ModelConfig, dict[str, GGUFWeight]]:
    """Config and the weights left in the file (the tokenizer comes from ``tokenizer_from_gguf``)."""
    gguf = GGUFFile(path)
    config = config_from_gguf(gguf.metadata, gguf.tensors)
    return config, weights_from_gguf(gguf, config)


def load_gguf(path) -> tuple[ModelConfig, dict[str, GGUFWeight], Tokenizer]:
    gguf = GGUFFile(path)
    config = config_from_gguf(gguf.metadata, gguf.tensors)
    return config, weights_from_gguf(gguf, config), tokenizer_from_gguf(gguf.metadata)


def read_gguf_config(path) -> ModelConfig:
    """Config only (for the planner): reads metadata and tensor names, no weights."""
    gguf = GGUFFile(path)
    return config_from_gguf(gguf.metadata, gguf.tensors)
