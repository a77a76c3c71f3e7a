"""Tiny random HF checkpoints of the Llama relatives (Qwen3, Gemma 2, Gemma 3 text, Phi-3,
Mistral with a sliding window), built with transformers' own classes, saved with a tokenizer
llama.cpp's converter accepts, so a test can convert them (``tests.support.convert``) and
compare what a loader reads with the safetensors.

Every parameter is random and non-zero (norm weights too, so Gemma's ``1 + w`` shows), and
each arch's distinctive features are on: q/k norms, soft-caps, small windows, a longrope
with distinct short/long factors.

Tokenizers: ``bpe`` reuses SmolLM2's byte-level BPE (49,152 tokens, pre-tokenizer hash
"smollm"); ``spm`` trains a tiny SentencePiece model (``tokenizer.model``) for the archs
whose converter class reads only SentencePiece (Gemma 2, Phi-3 without GPT2Tokenizer).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

HIDDEN, HEAD_DIM, HEADS, KV_HEADS, FFN = 64, 16, 4, 2, 96
BPE_VOCAB, SPM_VOCAB = 49152, 384
WINDOW = 8          # Gemma's and Mistral's sliding window (tokens); Phi-3's is twice that

_SPM_TEXT = ([f"The quick brown fox jumps over the lazy dog {i} times." for i in range(200)]
             + ["Hello world: a prefix caching gateway keeps a radix tree of prompts."] * 20)


_TRAIN = """
import sys, sentencepiece as spm
spm.SentencePieceTrainer.train(
    input=sys.argv[1], model_prefix=sys.argv[2], vocab_size=320, model_type="bpe",
    byte_fallback=True, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
    pad_id=0, eos_id=1, bos_id=2, unk_id=3)
"""


def spm_tokenizer(hf_dir: Path) -> None:
    """``tokenizer.model``: a tiny byte-fallback BPE SentencePiece model (<pad> 0, </s> 1,
    <s> 2, <unk> 3), plus the tokenizer_config.json the converters read. Trained in a
    subprocess: the sentencepiece wheel maps an OpenMP runtime of its own, and a second one
    beside torch's keeps the native kernels on one thread for the rest of the process."""
    text = hf_dir / "spm-text.txt"
    text.write_text("\n".join(_SPM_TEXT))
    subprocess.run([sys.executable, "-c", _TRAIN, str(text), str(hf_dir / "tokenizer")],
                   check=True, timeout=120)
    (hf_dir / "tokenizer.vocab").unlink()
    text.unlink()
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>", "pad_token": "<pad>"}))


def bpe_tokenizer(hf_dir: Path) -> None:
    """SmolLM2's tokenizer.json, read as it is (the converter hashes it as "smollm")."""
    from radixgate.runtime.model.loader import gguf_tokenizer
    from tests.support.convert import write_fast_tokenizer_config
    gguf_tokenizer("default").backend.save(str(hf_dir / "tokenizer.json"))
    write_fast_tokenizer_config(hf_dir, bos_token="<|im_start|>", eos_token="<|im_end|>")


def _common(vocab: int, layers: int) -> dict:
    return dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=FFN,
                num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                max_position_embeddings=256, rms_norm_eps=1e-6)


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(**_common(BPE_VOCAB, 2), head_dim=HEAD_DIM, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                      bos_token_id=1, eos_token_id=2)
    return cfg, Qwen3ForCausalLM, "bpe"


def _gemma2():
    from transformers import Gemma2Config, Gemma2ForCausalLM
    # query_pre_attn_scalar = head_dim: the GGUF has no key for it (llama.cpp derives it)
    cfg = Gemma2Config(**_common(SPM_VOCAB, 3), head_dim=HEAD_DIM, sliding_window=WINDOW,
                       attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                       query_pre_attn_scalar=HEAD_DIM, pad_token_id=0, eos_token_id=1,
                       bos_token_id=2)
    return cfg, Gemma2ForCausalLM, "spm"


def _gemma3():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    # 6 layers: the default layer_types put the one global layer at 5 ((i + 1) % 6 == 0)
    cfg = Gemma3TextConfig(
        **_common(BPE_VOCAB, 6), head_dim=HEAD_DIM, sliding_window=WINDOW,
        final_logit_softcapping=20.0, query_pre_attn_scalar=HEAD_DIM,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        pad_token_id=0, eos_token_id=2, bos_token_id=1)
    return cfg, Gemma3ForCausalLM, "bpe"


def _phi3():
    from transformers import Phi3Config, Phi3ForCausalLM
    half = HEAD_DIM // 2
    cfg = Phi3Config(
        **_common(SPM_VOCAB, 2), original_max_position_embeddings=64, sliding_window=2 * WINDOW,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10_000.0,
                         "short_factor": [1.0 + 0.1 * i for i in range(half)],
                         "long_factor": [2.0 + 0.5 * i for i in range(half)],
                         "original_max_position_embeddings": 64},
        bos_token_id=2, eos_token_id=1, pad_token_id=0)
    return cfg, Phi3ForCausalLM, "spm"


def _mistral():
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(**_common(BPE_VOCAB, 2), head_dim=HEAD_DIM, sliding_window=WINDOW,
                        rope_parameters={"rope_type": "default", "rope_theta": 100_000.0},
                        bos_token_id=1, eos_token_id=2)
    return cfg, MistralForCausalLM, "bpe"


BUILDERS = {"qwen3": _qwen3, "gemma2": _gemma2, "gemma3": _gemma3, "phi3": _phi3,
            "mistral": _mistral}


def hf_config(arch: str):
    return BUILDERS[arch]()[0]


def build(arch: str, hf_dir: Path, seed: int = 0) -> Path:
    """A random ``arch`` checkpoint (config.json, model.safetensors, tokenizer) in ``hf_dir``."""
    cfg, cls, tokenizer = BUILDERS[arch]()
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)          # norms too: Gemma's 1 + w must differ from w
    hf_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(hf_dir)
    (spm_tokenizer if tokenizer == "spm" else bpe_tokenizer)(hf_dir)
    return hf_dir


def hf_tensors(hf_dir: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors by HF name (float32)."""
    from safetensors.torch import load_file
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        out.update({k: v.float() for k, v in load_file(f).items()})
    return out
