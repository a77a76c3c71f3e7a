"""Incremental, UTF-8-safe detokenization.

Byte-level BPE tokens are byte strings: one character may be split over several tokens.
Each token's bytes go through an incremental UTF-8 decoder, which keeps an unfinished
multibyte sequence until the bytes that complete it arrive, so a delta never carries half a
character. Bytes that can never form valid UTF-8 become U+FFFD (as ``bytes.decode`` with
``errors="replace"`` would).
"""
from __future__ import annotations

import codecs
from collections.abc import Callable


class IncrementalDetokenizer:
    """Turns token ids into text deltas. ``token_bytes(id)`` gives a token's raw bytes."""

    def __init__(self, token_bytes: Callable[[int], bytes]):
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """The text completed by this token (possibly empty while a character is unfinished)."""
        return self._decoder.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        """Ends the stream: an unfinished trailing character becomes U+FFFD."""
        return self._decoder.decode(b"", final=True)


def token_bytes_function(tokenizer) -> Callable[[int], bytes]:
    """The tokenizer's per-token byte function, cached per id (tokens repeat a lot)."""
    to_bytes = tokenizer.token_to_bytes
    cache: dict[int, bytes] = {}

    def token_bytes(token_id: int) -> bytes:
        found = cache.get(token_id)
        if found is None:
            found = cache[token_id] = to_bytes(token_id)
        return found

    return token_bytes
