"""The writer thread of a ``KVTier`` (tier.py): staged blocks become records.

Per record, under the tier's lock: skip it when its namespace was purged since it was staged
(its epoch moved on) or when it is larger than the whole budget; else take victims from the
index for its bytes (their files are deleted outside the lock). Then write it (backends are
atomic) and index it, unless a purge came meanwhile. ``ENOSPC`` / ``EDQUOT`` stop writes for
``FULL_RETRY_S`` (a warning once; staged blocks are dropped and counted meanwhile).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from radixgate.kv.tiers.index import BlockAddress, TierRecord

from .backends import FULL_ERRNOS
from .records import encode_prefix

log = logging.getLogger(__name__)

FULL_RETRY_S = 30.0          # after ENOSPC, writes stop this long, then are tried again
RETENTION_SAVE_S = 1.0


@dataclass(slots=True)
class StagedWrite:
    space: str
    epoch: tuple[int, int]
    addresses: list[BlockAddress]
    parts: list[torch.Tensor]      # [n, layers, block_size, bytes per slot] each
    nbytes: int
    windowed: list[bool]           # per block: the window layers' part holds their K/V


@dataclass(slots=True)
class Purge:
    space: str | None


def run_writer(tier) -> None:
    """The writer thread of ``tier``: staged writes and purges, in queue order; ``None``
    ends it."""
    while True:
        job = tier.write_queue.get()
        if job is None:
            return
        try:
            if isinstance(job, Purge):
                tier.backend.purge(job.space)
            else:
                write(tier, job)
            save_retention(tier)
        except Exception:  # noqa: BLE001 - the writer must outlive one bad job
            log.exception("KV %s tier: a write job failed", tier.kind)


def write(tier, job: StagedWrite) -> None:
    try:
        for i, address in enumerate(job.addresses):
            if tier.full_until > tier.clock():
                with tier.lock:
                    tier.drops["disk_full"] += len(job.addresses) - i
                return
            write_one(tier, job, i, address)
    finally:
        tier.release_staged([a.digest for a in job.addresses], job.nbytes)


def write_one(tier, job: StagedWrite, i: int, address: BlockAddress) -> None:
    record = TierRecord(address.digest, job.space, address.parent, address.count,
                        tier.record_bytes(address.count), address.full)
    room = make_room(tier, record, job.epoch)
    if room is None:
        return
    victims, other_models = room
    for model in other_models:
        tier.backend.drop_other(model)
    for victim in victims:
        tier.backend.delete(victim)
    # numpy copies: a torch copy of a real-size block goes parallel on this thread and
    # gives it an OpenMP pool of its own (radixgate/runtime/engine/cpu_threads.py)
    payload = [memoryview(np.ascontiguousarray(part.numpy()[i, :, :address.count])).cast("B")
               for part in job.parts]
    prefix = encode_prefix(tier.fingerprint, record.digest, record.parent, record.count,
                           record.full, payload, job.windowed[i])
    try:
        tier.backend.put(record, prefix, payload)
    except OSError as exc:
        write_failed(tier, exc)
        return
    with tier.lock:
        current = job.epoch == (tier.epoch, tier.epochs.get(job.space, 0))
        if current:
            tier.index.add(record)
            tier.counts["writes"] += 1
            tier.counts["write_bytes"] += record.nbytes
    if not current:
        tier.backend.delete(record)        # purged while it was being written


def make_room(tier, record: TierRecord, epoch: tuple[int, int]) -> tuple[list, list] | None:
    """Under the lock: None when ``record`` is not to be written (purged since it was
    staged, or larger than the whole budget), else what goes for it: this model's records
    evicted (already out of the index) and other models' folders (no longer counted),
    those first (least recently used model first). Deleting them is the caller's."""
    with tier.lock:
        if epoch != (tier.epoch, tier.epochs.get(record.space, 0)):
            return None
        index, backend = tier.index, tier.backend
        if record.nbytes > index.budget_bytes:
            tier.drops["too_large"] += 1
            return None
        others = []
        while (backend.other_bytes and
               index.nbytes + record.nbytes + backend.other_bytes > index.budget_bytes):
            others.append(backend.take_oldest_other())
        victims = index.victims(record.nbytes, tier.clock())
        for victim in victims:
            index.remove(victim.digest)
        tier.counts["evicted"] += len(victims)
        return victims, others


def write_failed(tier, exc: OSError) -> None:
    now = tier.clock()
    with tier.lock:
        if exc.errno in FULL_ERRNOS:
            first = tier.full_until <= now
            tier.full_until = now + FULL_RETRY_S
            tier.drops["disk_full"] += 1
        else:
            first = True
            tier.drops["error"] += 1
    if exc.errno in FULL_ERRNOS and first:
        log.warning("KV %s tier %s: the disk is full (%s); writes stop for %.0f s, "
                    "serving goes on", tier.kind, tier.folder, exc.strerror, FULL_RETRY_S)
    elif first:
        log.error("KV %s tier %s: a write failed: %r", tier.kind, tier.folder, exc)


def save_retention(tier, force: bool = False) -> None:
    now = time.monotonic()
    if not tier.retention_dirty or (not force and now - tier.retention_saved
                                     < RETENTION_SAVE_S):
        return
    with tier.lock:
        tier.index.prune_retention(tier.clock())
        retention = dict(tier.index.retention)
        tier.retention_dirty = False
    tier.retention_saved = now
    try:
        tier.backend.save_retention(retention)
    except OSError as exc:
        log.warning("KV %s tier: saving the retention list failed: %r", tier.kind, exc)
