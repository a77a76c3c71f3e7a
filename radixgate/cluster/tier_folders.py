"""The disk tier folder of a deployment: one subfolder per replica index, claimed at start.

With ``--replicas N --kv-disk-dir D`` (``[cluster] max_replicas`` for N under autoscaling)::

    D/lock              held by the gateway while the deployment runs: a second server on D
                        (one engine, or another deployment) is refused at its start
    D/replica-I/        replica I's own tier folder (``CacheConfig.for_replica``), with
                        ``[cache.disk] gb / N`` of the budget
    D/replica-I/claim   held (flock) by the replica process that has index I

``prepare_deployment_folder`` (the gateway, before Ray starts) takes ``D/lock``, checks that
each of the N replica folders can be used now (writable, no replica of another run holds
it) and deletes the folders of indices >= N (replicas that no longer exist). Each replica
then ``claim_replica_index``: the lowest index whose claim is free. A replica that dies
frees its claim with its process, so the one Ray Serve starts in its place takes the same
index and finds its own blocks; an autoscaled replica takes the lowest free index below N.
Claims are flocks, so two replicas starting at once never share an index.
"""
from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

from radixgate.kv.config import (REPLICA_FOLDER_PREFIX, CacheConfig, DiskTierConfig,
                                  replica_disk_dir)
from radixgate.kv.tiers.disk import TierFolderError, check_disk_folder
from radixgate.kv.tiers.disk.folders import (delete_folder, lock_holder, make_private_dir,
                                               open_locked, try_lock, unusable)

log = logging.getLogger(__name__)
CLAIM = "claim"
CLAIM_WAIT_S = 60.0           # a replica waits this long for a claim its predecessor frees
CLAIM_POLL_S = 0.25
_REPLICA_NAME = re.compile(rf"^{re.escape(REPLICA_FOLDER_PREFIX)}(\d+)$")
_held: dict[str, int] = {}    # deployment folder -> the fd of its lock, for this process


def prepare_deployment_folder(cache: CacheConfig, slots: int) -> None:
    """Before the replicas start: hold ``cache.disk.dir`` for this process, check the
    ``slots`` replica folders and reclaim those of indices >= ``slots``. TierFolderError
    (one line) when a folder cannot be used or another server or replica holds it. Holding
    again in the same process is a no-op."""
    if not cache.disk.enabled or cache.disk.dir in _held:
        return
    folder = Path(cache.disk.dir)
    fd = open_locked(folder)      # the tier folder's own lock: one server per folder
    try:
        for index in range(slots):
            _check_replica_folder(Path(replica_disk_dir(cache.disk.dir, index)), index)
        _reclaim_beyond(folder, slots)
    except BaseException:
        os.close(fd)
        raise
    _held[cache.disk.dir] = fd


def release_deployment_folder(disk_dir: str) -> None:
    fd = _held.pop(disk_dir, None)
    if fd is not None:
        os.close(fd)


def claim_replica_index(cache: CacheConfig, slots: int, *, wait_s: float = CLAIM_WAIT_S,
                        poll_s: float = CLAIM_POLL_S) -> tuple[int, int]:
    """(index, claim fd) of the lowest free replica index below ``slots``; the claim holds
    while the fd is open (the process's life). Waits up to ``wait_s`` for one to be freed
    (a replica being replaced may still be stopping), then TierFolderError."""
    deadline = time.monotonic() + wait_s
    while True:
        for index in range(slots):
            fd = _try_lock(Path(replica_disk_dir(cache.disk.dir, index)) / CLAIM)
            if fd is not None:
                return index, fd
        if time.monotonic() >= deadline:
            raise TierFolderError(
                f"every replica folder of the KV disk tier {cache.disk.dir} (replica-0 .. "
                f"replica-{slots - 1}) is claimed by a running replica")
        time.sleep(poll_s)


def _check_replica_folder(folder: Path, index: int) -> None:
    """Raise unless replica ``index``'s folder is writable and nothing holds it."""
    try:
        fd = _try_lock(folder / CLAIM)
    except OSError as exc:
        raise unusable(folder, exc) from exc
    if fd is None:
        raise TierFolderError(
            f"the KV disk tier folder {folder} is in use by replica {index} of another "
            f"deployment (pid {lock_holder(folder / CLAIM)}): stop it first, or use another "
            "--kv-disk-dir")
    os.close(fd)
    check_disk_folder(CacheConfig(disk=DiskTierConfig(str(folder), 1.0)))


def _reclaim_beyond(folder: Path, slots: int) -> None:
    """Delete the folders of replica indices >= ``slots`` (their replicas no longer exist)."""
    for entry in sorted(folder.iterdir()):
        match = _REPLICA_NAME.match(entry.name)
        if match is None or int(match.group(1)) < slots or not entry.is_dir():
            continue
        _check_replica_folder(entry, int(match.group(1)))    # nobody uses it any more
        delete_folder(entry)
        log.info("KV disk tier %s: deleted %s (a replica index the deployment no longer "
                 "has: it runs %d)", folder, entry.name, slots)


def _try_lock(path: Path) -> int | None:
    """``folders.try_lock`` on ``path``, its folder made (private) first."""
    make_private_dir(path.parent)
    return try_lock(path)


