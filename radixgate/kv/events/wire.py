"""KV events on the wire, both ways: the records and vLLM's msgpack form of them.

The one definition of the format: the publisher (``publisher.py``) encodes the records
``BlockTracker`` (``blocks.py``) makes, and the router's subscriber
(``radixgate/cluster/subscriber.py``) decodes them back into the same records. Each record
class writes itself (``to_wire``) and reads itself back (``from_wire``) next to its fields.

The layout is vLLM's ``KVEventBatch`` (``vllm/distributed/kv_events.py``) in msgspec's
``array_like`` layout, which external routers such as llm-d and Dynamo decode: structs
as arrays, fields in declaration order, an event's first element its tag (the class name)::

    batch: [ts: float, [event, ...], data_parallel_rank: int | None]
    event: ["BlockStored", block_hashes: [int], parent_block_hash: int | None,
            token_ids: [int], block_size: int, lora_id: None, medium: str, lora_name: None]
         | ["BlockRemoved", block_hashes: [int], medium: str]
         | ["AllBlocksCleared"]

``medium`` is ``DEFAULT_MEDIUM`` ("GPU", vLLM's name for the engine's own pool, whatever
the device) unless the record names one: ``WINDOW_MEDIUM`` ("GPU_WINDOW", radixgate's own)
on a ``BlockRemoved`` says the window layers' pool let go of the blocks' K/V while the
global layers keep them. vLLM's later fields (``extra_keys``, ``group_idx``, the cache
spec) are not sent: a decoder takes their defaults. Block hashes are signed 64-bit ints,
radixgate's chained content addresses (``radixgate/kv/core/block_hash.py``), not vLLM's
hash values. A decoder skips event tags it does not know (a newer publisher may send more
kinds) and reads only the fields it knows (a newer publisher may append fields).
"""
from __future__ import annotations

from dataclasses import dataclass

import msgpack

DEFAULT_MEDIUM = "GPU"          # the engine's own KV pool
WINDOW_MEDIUM = "GPU_WINDOW"    # the window layers' pool (a second KV cache group)


class KVDecodeError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks now cached, a chain: each hash's parent is the one before it, the first
    one's is ``parent_block_hash`` (None at the namespace's root)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int

    def to_wire(self, medium: str) -> list:
        return ["BlockStored", list(self.block_hashes), self.parent_block_hash,
                list(self.token_ids), self.block_size, None, medium, None]

    @classmethod
    def from_wire(cls, raw: list) -> BlockStored:
        return cls(tuple(raw[1]), raw[2], tuple(raw[3]), int(raw[4]))


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Announced blocks gone (``medium`` None: from the publisher's own pool; or only their
    window layers' K/V, ``WINDOW_MEDIUM``)."""

    block_hashes: tuple[int, ...]
    medium: str | None = None

    def to_wire(self, medium: str) -> list:
        return ["BlockRemoved", list(self.block_hashes), self.medium or medium]

    @classmethod
    def from_wire(cls, raw: list) -> BlockRemoved:
        window = len(raw) > 2 and raw[2] == WINDOW_MEDIUM
        return cls(tuple(raw[1]), WINDOW_MEDIUM if window else None)


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Forget everything this publisher announced before (it started or restarted)."""

    def to_wire(self, medium: str) -> list:
        return ["AllBlocksCleared"]

    @classmethod
    def from_wire(cls, raw: list) -> AllBlocksCleared:
        return cls()


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
RECORDS: dict[str, type] = {kind.__name__: kind
                            for kind in (BlockStored, BlockRemoved, AllBlocksCleared)}


def encode_batch(events: list[KVEvent], ts: float, rank: int | None = None,
                 medium: str = DEFAULT_MEDIUM) -> bytes:
    """One ``KVEventBatch`` as msgpack bytes (``medium``: where a record naming none lives)."""
    return msgpack.packb([ts, [event.to_wire(medium) for event in events], rank],
                         use_bin_type=True)


def decode_batch(payload: bytes) -> tuple[float, list[KVEvent], int | None]:
    """``(ts, events, data_parallel_rank)`` of one ``KVEventBatch``; events of a kind not
    in ``RECORDS`` are skipped. ``KVDecodeError`` when ``payload`` is not a batch."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        ts, raw_events = batch[0], batch[1]
        rank = batch[2] if len(batch) > 2 else None
        return float(ts), [e for e in map(decode_event, raw_events) if e is not None], rank
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as e:
        raise KVDecodeError(f"not a KV event batch: {e}") from e


def decode_event(raw: list) -> KVEvent | None:
    """One event's record, or None for a kind this side does not know."""
    tag = raw[0]
    kind = RECORDS.get(tag) if isinstance(tag, str) else None
    return None if kind is None else kind.from_wire(raw)
