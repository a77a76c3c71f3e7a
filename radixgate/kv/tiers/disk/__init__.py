"""KV tiers below memory: evicted blocks kept on disk (or host RAM) and loaded back.

``open_disk_tier(cache, kv, fingerprint)`` builds the disk tier a ``CacheConfig`` asks for
(``cache.disk``); tier.py holds the tier (its engine-thread side), writer.py and
reader.py its two threads, backends.py the storage, records.py the record format,
fingerprint.py the model fingerprint, and glue.py the engine's side (the tier wired to the
tree's evictions, long pins written through, the tree kept at shutdown). It imports nothing
of runtime.engine (the glue reaches the engine's tree only through the objects it is
handed); of runtime.model, only fingerprint.py reads a GGUF file's header
(tests/test_import_graph.py).
"""
from __future__ import annotations

from collections.abc import Callable

from .backends import DiskBackend, MemoryBackend, TierBackend, TierFolderError
from .records import CorruptRecord
from .tier import KVTier, LoadTicket, TierStats, space_key


def check_disk_folder(cache) -> None:
    """Before loading a model: ``TierFolderError`` now when ``cache``'s disk tier folder
    cannot be used (unwritable, or held by another server); nothing without a tier."""
    if cache.disk.enabled:
        DiskBackend.check_folder(cache.disk.dir)


def open_disk_tier(cache, kv, fingerprint: bytes, description: str = "",
                   wake: Callable[[], None] | None = None) -> KVTier:
    """The disk tier of ``cache`` (a CacheConfig with ``disk.dir``) over ``kv``; raises
    ``TierFolderError`` when its folder cannot be used (unwritable, held by another server).
    ``wake``: called on the tier's reader thread when a load finished."""
    backend = DiskBackend(cache.disk.dir, fingerprint, description)
    try:
        return KVTier(backend, kv, fingerprint, cache.disk.budget_bytes, kind="disk",
                      folder=str(cache.disk.dir), wake=wake)
    except BaseException:
        backend.close()
        raise


__all__ = ["CorruptRecord", "check_disk_folder", "DiskBackend", "KVTier", "LoadTicket", "MemoryBackend",
           "TierBackend", "TierFolderError", "TierStats",
           "open_disk_tier", "space_key"]
