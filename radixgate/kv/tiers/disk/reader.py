"""The reader thread of a ``KVTier`` (tier.py): a request's stored run read back into
its own memory blocks, record by record, each checked first (records.py); a record that is
gone or fails its checks ends the run there (and is forgotten, its file deleted).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

import torch

from radixgate.kv.tiers.index import TierRecord, TierRun

from .records import CorruptRecord, decode

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LoadTicket:
    """One request's load: ``run``'s records into ``blocks``; ``loaded`` of them are in
    (in order) once ``done`` is set; ``unwindowed``: the indices (into ``blocks``) of those
    whose record had no window-layer K/V (the window pool had tombstoned them). ``cancel()``
    stops it at the next record."""

    run: TierRun
    blocks: list[int]
    block_size: int
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False
    loaded: int = 0
    unwindowed: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        """Tokens from position 0 that are valid once done (memory part included)."""
        return (self.run.first_index * self.block_size
                + sum(r.count for r in self.run.records[:self.loaded]))

    def cancel(self) -> None:
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


def run_reader(tier) -> None:
    """The reader thread of ``tier``: one ticket at a time; ``None`` ends it. Each ticket
    ends with ``done`` set and ``tier.wake()``."""
    while True:
        ticket = tier.load_queue.get()
        if ticket is None:
            return
        started = time.perf_counter()
        try:
            load(tier, ticket)
        except Exception:  # noqa: BLE001 - the request recomputes what did not load
            log.exception("KV %s tier: a load failed", tier.kind)
        finally:
            with tier.lock:
                tier.load_s += time.perf_counter() - started
            ticket.done.set()
            if tier.wake is not None:
                tier.wake()


def load(tier, ticket: LoadTicket) -> None:
    for i, (record, block) in enumerate(zip(ticket.run.records, ticket.blocks)):
        if ticket.cancelled:
            return
        found = read(tier, record)
        if found is None:
            return
        parts, windowed = found
        tier.kv.write_block(block, parts, record.count)
        if not windowed:
            ticket.unwindowed.append(i)
        ticket.loaded += 1
        tier.backend.touch(record)
        with tier.lock:
            tier.index.touch(record.digest, tier.clock())
            tier.counts["loaded_blocks"] += 1
            tier.counts["load_bytes"] += record.nbytes


def read(tier, record: TierRecord) -> tuple[list[torch.Tensor], bool] | None:
    """The record's parts (``[layers, count, bytes per slot]`` each) and whether they hold
    the window layers' K/V, or None when it is gone or fails its checks (then it is
    forgotten, its file deleted). A block still staged for the writer is served from its
    staged copy."""
    staged = tier.staged_copy(record.digest, record.count)
    if staged is not None:
        return staged
    data = tier.backend.read(record)
    try:
        if data is None:
            raise FileNotFoundError(record.digest.hex())
        payload, windowed = decode(data, tier.fingerprint, record.digest, record.count,
                         tier.payload_bytes(record.count))
    except (CorruptRecord, FileNotFoundError) as exc:
        reason = "missing" if isinstance(exc, FileNotFoundError) else "corrupt"
        if reason == "corrupt":
            log.warning("KV %s tier: dropped a damaged record (%s)", tier.kind, exc)
        with tier.lock:
            tier.drops[reason] += 1
            if tier.index.get(record.digest) is record:
                tier.index.remove(record.digest)
        tier.backend.delete(record)
        return None
    flat = torch.frombuffer(payload, dtype=torch.uint8)
    parts, offset = [], 0
    for layers, slot in zip(tier.part_layers, tier.slot_bytes):
        size = layers * record.count * slot
        parts.append(flat[offset:offset + size].view(layers, record.count, slot))
        offset += size
    return parts, windowed
