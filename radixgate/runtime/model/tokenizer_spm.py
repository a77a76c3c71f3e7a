"""SentencePiece BPE vocabularies (GGUF ``tokenizer.ggml.model == "llama"``: Llama 2, Mistral
v0.x, Gemma, Phi-3) as a ``tokenizers`` backend that encodes as llama.cpp does.

A GGUF keeps SentencePiece's pieces, their scores and their types, but no merges. SentencePiece
BPE joins, again and again, the adjacent pair whose joined piece has the highest score; a BPE
model with one merge per way of cutting each normal piece in two, ranked by that piece's score,
does the same. Characters outside the vocabulary fall back to the ``<0xNN>`` byte pieces.

Spaces become ``▁``. With ``add_space_prefix`` (Llama, Mistral; the default when the key is
absent) each run of text also gets one ``▁`` in front, even one that starts with a space
(``" hi"`` -> ``▁▁hi``), as SentencePiece does. Added tokens (control, unknown, user-defined)
are matched in the raw text first and every stretch of text between them is encoded on its own,
so the prefix comes back after each of them, as llama.cpp does (and transformers' legacy
``Prepend`` + ``Replace`` normalizer). transformers' ``Metaspace`` pre-tokenizer adds no prefix
to text that already starts with a space, so it is not used here.
"""
from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as HFTokenizer

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"


def bpe_merges(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]) -> list[tuple[str, str]]:
    """Every ``(left, right)`` pair of normal pieces that joins into a normal piece, best joined
    piece first (highest score; the lower id on ties, where SentencePiece and llama.cpp take
    the leftmost pair in the text: the same wherever scores are distinct, as in Llama 2's and
    Gemma's files). Control, byte, unused and user-defined pieces are never the result of a
    merge, as in SentencePiece."""
    normal = {t for t, k in zip(tokens, types) if k == NORMAL}
    ranked = []
    for i, (piece, score, kind) in enumerate(zip(tokens, scores, types)):
        if kind != NORMAL:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-float(score), i, cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _normalizer(add_space_prefix: bool):
    replace = normalizers.Replace(" ", SPACE)
    if not add_space_prefix:
        return replace
    return normalizers.Sequence([normalizers.Prepend(SPACE), replace])


def _decoder(add_space_prefix: bool):
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:   # the prefix of the text's first piece
        steps.append(decoders.Strip(" ", 1, 0))
    return decoders.Sequence(steps)


def _add_tokens(backend: HFTokenizer, tokens: Sequence[str], types: Sequence[int]) -> None:
    """Control and unknown pieces become special added tokens, user-defined ones plain added
    tokens; all are matched in the raw text (``normalized=False``), before any ``▁``."""
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t, k in zip(tokens, types) if k in (CONTROL, UNKNOWN)])
    backend.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, k in zip(tokens, types) if k == USER_DEFINED])


def spm_backend(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int], *,
                add_space_prefix: bool = True, unk_id: int | None = None) -> HFTokenizer:
    """The backend for one SentencePiece vocabulary. ``types``: SentencePiece piece types
    (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte); ``unk_id``: the
    unknown piece, used for a character with no byte piece to fall back to."""
    vocab = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=bpe_merges(tokens, scores, types),
                                     unk_token=unk, fuse_unk=True, byte_fallback=True))
    backend.normalizer = _normalizer(add_space_prefix)
    backend.decoder = _decoder(add_space_prefix)
    _add_tokens(backend, tokens, types)
    return backend


def spm_special_ids(types: Sequence[int]) -> set[int]:
    """Ids of the special (control and unknown) pieces."""
    return {i for i, k in enumerate(types) if k in (CONTROL, UNKNOWN)}


def spm_backend_from_gguf(meta: dict) -> HFTokenizer:
    """``spm_backend`` from a GGUF's ``tokenizer.ggml.*`` metadata."""
    tokens = list(meta["tokenizer.ggml.tokens"])
    scores = [float(s) for s in meta.get("tokenizer.ggml.scores", [0.0] * len(tokens))]
    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens))]
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    return spm_backend(tokens, scores, types,
                       add_space_prefix=bool(meta.get("tokenizer.ggml.add_space_prefix", True)),
                       unk_id=None if unk is None else int(unk))
