"""Tokenizer: a ``tokenizers.Tokenizer`` plus the model's special tokens and chat template.

Built from a GGUF file's ``tokenizer.ggml.*`` metadata (byte-level BPE, ``gpt2`` model; or
SentencePiece BPE, ``llama`` model: tokenizer_spm.py) or from an HF ``tokenizer.json``. ``encode`` never adds BOS or other
special tokens, but special tokens written literally in the text (``<|im_start|>``) become
their ids, as HF tokenizers do for added tokens.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


_UNICODE_TO_BYTE = {c: b for b, c in bytes_to_unicode().items()}
_BYTE_ALPHABET = frozenset(_UNICODE_TO_BYTE)
_UNICODE_TO_LATIN1 = str.maketrans({c: chr(b) for c, b in _UNICODE_TO_BYTE.items()})


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


class Tokenizer:
    """Text <-> token ids for one model.

    ``eos_token_ids`` holds every id that ends a turn (EOS, EOT and the well-known end
    markers the vocabulary marks as control tokens); ``special_token_ids`` every special
    (control) token.
    """

    def __init__(self, backend: HFTokenizer, *, bos_token_id: int | None, eos_token_ids: set[int],
                 chat_template: str | None, special_token_ids: set[int],
                 eos_token_id: int | None = None):
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = set(eos_token_ids)
        if eos_token_id is None and self.eos_token_ids:
            eos_token_id = min(self.eos_token_ids)
        self.eos_token_id = eos_token_id          # the model's own EOS (template's eos_token)
        if eos_token_id is not None:
            self.eos_token_ids.add(eos_token_id)
        self.chat_template = chat_template or ""
        self.special_token_ids = set(special_token_ids)
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    # --- encode / decode ---
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; adds no BOS/EOS, parses literal special tokens."""
        return _encode(self.backend, text)

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of untrusted ``text``: literal special-token strings such as
        ``<|im_end|>`` are encoded as ordinary text, never as control tokens, so message
        content cannot forge chat-template structure."""
        return _encode(self._plain_backend, text)

    def warm_up(self) -> None:
        """Builds the lazily made parts now (the plain-text backend: ~130 ms of native code
        that holds the GIL), so no request pays for them."""
        self.encode_plain("warm up")
        getattr(self, "max_plain_token_bytes", None)

    @cached_property
    def _plain_backend(self) -> HFTokenizer:
        """A copy, so the shared backend's flag never flips under another reader."""
        plain = HFTokenizer.from_str(self.backend.to_str())
        plain.encode_special_tokens = True
        return plain

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    # --- bytes (for UTF-8-safe incremental detokenization) ---
    @cached_property
    def _token_bytes(self) -> list[bytes]:
        """The raw bytes each token id stands for (special tokens: their text)."""
        decoder = self.backend.decoder       # its JSON alone (the whole tokenizer's took 110 ms)
        byte_level = decoder is not None and b"ByteLevel" in decoder.__getstate__()
        added = {i: t.content for i, t in self.backend.get_added_tokens_decoder().items()}
        pieces = [""] * self.vocab_size
        for piece, i in self.backend.get_vocab(with_added_tokens=True).items():
            if 0 <= i < self.vocab_size:
                pieces[i] = piece
        table = []
        for i, piece in enumerate(pieces):
            if i in added:
                table.append(added[i].encode("utf-8"))
            elif byte_level:
                table.append(_byte_level_bytes(piece))
            else:
                table.append(_sentencepiece_bytes(piece))
        return table

    @cached_property
    def max_plain_token_bytes(self) -> int:
        """The most UTF-8 bytes one token of ``encode_plain`` output can stand for (added and
        special tokens excluded: plain text never becomes them). Gives a cheap lower bound
        on a text's token count before tokenizing it."""
        added = set(self.backend.get_added_tokens_decoder())
        return max((len(b) for i, b in enumerate(self._token_bytes) if i not in added), default=1)

    def token_to_bytes(self, token_id: int) -> bytes:
        """Bytes of one token; a multi-byte character may be split across tokens. Ids past
        the tokenizer's vocabulary (a model's padded embedding rows) have no bytes."""
        table = self._token_bytes
        return table[token_id] if 0 <= token_id < len(table) else b""

    def decode_bytes(self, ids, skip_special_tokens: bool = False) -> bytes:
        """Concatenated token bytes: decode incrementally and cut at a UTF-8 boundary."""
        skip = self.special_token_ids if skip_special_tokens else ()
        return b"".join(self.token_to_bytes(i) for i in ids if i not in skip)

    # --- chat template ---
    @cached_property
    def _template(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, **kw: json.dumps(
            x, indent=indent, ensure_ascii=ensure_ascii, sort_keys=kw.get("sort_keys", False))
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.chat_template)

    @property
    def bos_token(self) -> str:
        return self.id_to_token(self.bos_token_id) if self.bos_token_id is not None else ""

    @property
    def eos_token(self) -> str:
        return self.id_to_token(self.eos_token_id) if self.eos_token_id is not None else ""

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            **kwargs) -> str:
        """Render ``messages`` with the model's own jinja2 template (HF globals)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template")
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token, eos_token=self.eos_token, **kwargs)


LONG_TEXT_CHARS = 4096   # from this length on, encode without holding the interpreter lock


def _encode(backend: HFTokenizer, text: str) -> list[int]:
    """The backend's ids for ``text``. A long text goes through ``encode_batch``, which
    releases Python's interpreter lock while it works (``encode`` holds it: 0.7 s for 2 MB,
    during which no other request's thread, nor the event loop, can run); same ids."""
    if len(text) < LONG_TEXT_CHARS:
        return backend.encode(text, add_special_tokens=False).ids
    return backend.encode_batch([text], add_special_tokens=False)[0].ids


def _byte_level_bytes(piece: str) -> bytes:
    """The bytes a byte-level BPE piece stands for (a piece with a character outside the
    byte alphabet: its UTF-8), through one ``str.translate`` (a generator per piece took
    ~40 ms over a 49k vocabulary)."""
    if not _BYTE_ALPHABET.issuperset(piece):
        return piece.encode("utf-8")
    return piece.translate(_UNICODE_TO_LATIN1).encode("latin-1")


def _sentencepiece_bytes(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode("utf-8")
