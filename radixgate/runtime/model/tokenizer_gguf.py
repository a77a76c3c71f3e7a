"""Build a ``Tokenizer`` from a GGUF file's ``tokenizer.ggml.*`` metadata.

Supports ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE: SmolLM, Llama 3, Qwen2, ...),
with the pre-tokenizer split chosen by ``tokenizer.ggml.pre`` as llama.cpp does, and
``"llama"`` (SentencePiece BPE: Llama 2, Mistral v0.x, Gemma, Phi-3; see ``tokenizer_spm``).
"""
from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from radixgate.runtime.model.tokenizer import Tokenizer
from radixgate.runtime.model.tokenizer_spm import spm_backend_from_gguf, spm_special_ids

_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
           "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}

# Text of end-of-turn markers that llama.cpp also treats as end of generation.
END_MARKERS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
               "<end_of_turn>", "<|end_of_text|>", "<end_of_utterance>", "</s>")


def _pre_tokenizer(pre: str | None):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":   # digits one by one, then GPT-2's split
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _SPLITS:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    return byte_level


def _backend(tokens: list[str], merges: list[str], token_types, pre: str | None) -> HFTokenizer:
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = _pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False)
                for t, k in zip(tokens, token_types) if k == _TOKEN_TYPE_CONTROL]
    user = [AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, token_types) if k == _TOKEN_TYPE_USER_DEFINED]
    backend.add_special_tokens(specials)
    backend.add_tokens(user)
    return backend


def tokenizer_from_gguf(meta: dict) -> Tokenizer:
    """``meta``: the GGUF metadata dict (see ``gguf_file.GGUFFile``)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise NotImplementedError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level "
                                  f"BPE 'gpt2' and SentencePiece 'llama'); load the HF directory "
                                  f"with tokenizer.json instead")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [1] * len(tokens))]
    if kind == "llama":
        backend, special_ids = spm_backend_from_gguf(meta), spm_special_ids(types)
    else:
        backend = _backend(tokens, list(meta.get("tokenizer.ggml.merges", [])), types,
                           meta.get("tokenizer.ggml.pre"))
        special_ids = {i for i, k in enumerate(types) if k == _TOKEN_TYPE_CONTROL}
    eos = {int(meta[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                  "tokenizer.ggml.eom_token_id") if k in meta}
    eos |= {i for i in special_ids if tokens[i] in END_MARKERS}
    bos, main_eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    return Tokenizer(backend, bos_token_id=None if bos is None else int(bos), eos_token_ids=eos,
                     chat_template=meta.get("tokenizer.chat_template"), special_token_ids=special_ids,
                     eos_token_id=None if main_eos is None else int(main_eos))
