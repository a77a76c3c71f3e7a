"""Chained block hashes: the content address of a KV block.

A full block's hash covers everything its K/V depends on: the seed (model fingerprint and
KV layout, so a different model, dtype or block size never shares an address), the
namespace (tenant and salt: no tenant can name another's blocks, whatever tokens it sends)
and every token id from the start of the sequence to the block's end, through the chain
``h[j] = H(h[j-1] || tokens of block j)``. Two sequences share ``h[j]`` exactly when they
share the namespace and the first ``(j + 1) * block_size`` tokens.

``tail_hash`` addresses a partial last block: it hashes the chain so far and the tail's
tokens with their count, and is never a parent of anything.

The disk tier keys its records by the 16-byte digests; KV events (vLLM's format) announce
``as_event_id(h)``, the first 8 bytes as a signed 64-bit integer.
"""
from __future__ import annotations

import hashlib
from array import array
from typing import Sequence

DIGEST_SIZE = 16
_TAIL_MARK = b"\x01tail"


def root_hash(seed: bytes | str, namespace: str) -> bytes:
    """The chain's start for ``namespace`` under ``seed`` (the model fingerprint)."""
    seed_bytes = seed.encode() if isinstance(seed, str) else seed
    return _digest(b"radixgate-kv-root\x00" + seed_bytes + b"\x00" + namespace.encode())


def block_hashes(parent: bytes, tokens: Sequence[int], block_size: int) -> list[bytes]:
    """Hashes of the full blocks of ``tokens``, which start on a block boundary right after
    the block whose hash is ``parent`` (``root_hash(...)`` at position 0). A partial last
    block gets no hash here (see ``tail_hash``)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    out: list[bytes] = []
    previous = parent
    for begin in range(0, len(tokens) - block_size + 1, block_size):
        previous = _digest(previous + _token_bytes(tokens[begin:begin + block_size]))
        out.append(previous)
    return out


def tail_hash(parent: bytes, tail_tokens: Sequence[int]) -> bytes:
    """The address of a partial block holding ``tail_tokens`` after the block ``parent``."""
    count = len(tail_tokens).to_bytes(4, "little")
    return _digest(parent + _TAIL_MARK + count + _token_bytes(tail_tokens))


def as_event_id(digest: bytes) -> int:
    """A digest as the signed 64-bit integer KV events carry."""
    return int.from_bytes(digest[:8], "little", signed=True)


def _token_bytes(tokens: Sequence[int]) -> bytes:
    return array("I", tokens).tobytes()


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()
