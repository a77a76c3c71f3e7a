"""Decoding vLLM-format KV event batches (``radixgate/kv/events/publisher.py`` writes them)."""
from __future__ import annotations

import msgpack

from radixgate.kv.events.blocks import (WINDOW_MEDIUM, AllBlocksCleared, BlockRemoved,
                                             BlockStored, KVEvent)


class KVDecodeError(ValueError):
    pass


def decode_batch(payload: bytes) -> tuple[float, list[KVEvent], int | None]:
    """``(ts, events, data_parallel_rank)`` of one ``KVEventBatch``; unknown event tags
    are skipped (a newer publisher may send more kinds)."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        ts, raw_events = batch[0], batch[1]
        rank = batch[2] if len(batch) > 2 else None
        return float(ts), [e for e in map(decode_event, raw_events) if e is not None], rank
    except (ValueError, TypeError, IndexError, msgpack.UnpackException) as e:
        raise KVDecodeError(f"not a KV event batch: {e}") from e


def decode_event(raw: list) -> KVEvent | None:
    tag = raw[0]
    if tag == "BlockStored":
        return BlockStored(tuple(raw[1]), raw[2], tuple(raw[3]), int(raw[4]))
    if tag == "BlockRemoved":
        window = len(raw) > 2 and raw[2] == WINDOW_MEDIUM      # the window layers' group
        return BlockRemoved(tuple(raw[1]), WINDOW_MEDIUM if window else None)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None
