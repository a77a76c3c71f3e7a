"""One tier record as bytes: a fixed header, a checksum, then the block's K/V bytes.

    header  <4s H B B H 2x 16s 16s 16s Q>  magic "RGKV", format version, full (0/1), flags
            (bit 0: the window layers' part holds their K/V; a block the window pool had
            tombstoned is stored with zeros there), token count, model fingerprint, digest
            (the block's chained hash), parent digest, payload length
    check   16 bytes: xxh3-128 of header + payload
    payload the block's slots [0, count) of every KV part (K, V, and the 8-bit dtypes'
            scales), each [layers, count, bytes per slot], in KVCache.block_parts order

``decode`` accepts a record only when every header field is the one expected (the digest
it was looked up by, the fingerprint of the running model, the count, the length) and the
checksum matches: a torn write, a flipped bit or a file of another model reads as nothing.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence

import xxhash

MAGIC = b"RGKV"
FORMAT_VERSION = 2
HEADER = struct.Struct("<4sHBBH2x16s16s16sQ")
WINDOWED = 1
CHECK_BYTES = 16
PREFIX_BYTES = HEADER.size + CHECK_BYTES


class CorruptRecord(ValueError):
    """A record whose header, length or checksum is not what was expected."""


def encode_prefix(fingerprint: bytes, digest: bytes, parent: bytes, count: int, full: bool,
                  payload: Sequence[memoryview], windowed: bool = True) -> bytes:
    """Header and checksum for ``payload`` (its parts in order); the record is the prefix
    followed by the parts. ``windowed``: the window layers' K/V are in it (see above)."""
    length = sum(part.nbytes for part in payload)
    header = HEADER.pack(MAGIC, FORMAT_VERSION, int(full), WINDOWED if windowed else 0, count,
                         fingerprint, digest, parent, length)
    check = xxhash.xxh3_128(header)
    for part in payload:
        check.update(part)
    return header + check.digest()


def decode(data: bytes | bytearray | memoryview, fingerprint: bytes, digest: bytes,
           count: int, payload_bytes: int) -> tuple[memoryview, bool]:
    """The payload of a record read back and whether it holds the window layers' K/V, or
    ``CorruptRecord``."""
    view = memoryview(data)
    if len(view) != PREFIX_BYTES + payload_bytes:
        raise CorruptRecord(f"record of {len(view)} bytes, expected {PREFIX_BYTES + payload_bytes}")
    magic, version, _full, flags, got_count, got_fp, got_digest, _parent, length = \
        HEADER.unpack_from(view)
    if (magic, version) != (MAGIC, FORMAT_VERSION):
        raise CorruptRecord(f"not a record of format {FORMAT_VERSION}")
    if got_fp != fingerprint:
        raise CorruptRecord("written by another model or KV layout (fingerprint differs)")
    if got_digest != digest or got_count != count or length != payload_bytes:
        raise CorruptRecord("header does not match its address")
    check = xxhash.xxh3_128(view[:HEADER.size])
    check.update(view[PREFIX_BYTES:])
    if check.digest() != bytes(view[HEADER.size:PREFIX_BYTES]):
        raise CorruptRecord("checksum mismatch (torn or damaged record)")
    return view[PREFIX_BYTES:], bool(flags & WINDOWED)
