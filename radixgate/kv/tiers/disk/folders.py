"""The disk tier's folders: private (0700) folders, the server lock, the per-model subfolders.

Layout of a tier folder ``DIR`` (backends.py's ``DiskBackend`` reads and writes the
records)::

    DIR/lock                        flock held while a server uses DIR (its pid inside)
    DIR/models/FP/tier.json         format version, fingerprint, model name; its mtime is
                                    when a server last used this model
    DIR/models/FP/retention.json    pinned prefixes (digest -> [until, ttl_s])
    DIR/models/FP/blocks/SPACE/...  the records of one namespace

``FP`` is the model fingerprint (fingerprint.py) in hex: another model, KV dtype or block
size gets its own subfolder, and all of them share one budget; the least recently used
model's records are the first to go when the current one needs room. Every folder is 0700
and every file 0600, whatever the umask and whatever mode an existing folder had.
"""
from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
MODELS = "models"


class TierFolderError(RuntimeError):
    """The disk tier's folder cannot be used (unwritable, or another server holds it)."""


def make_private_dir(path: Path) -> Path:
    """``path`` and each missing parent created 0700 (``mkdir(parents=True)`` gives the
    parents it creates the umask's mode); an existing ``path`` is set to 0700."""
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        folder.mkdir(mode=PRIVATE_DIR, exist_ok=True)
    if stat_mode(path) != PRIVATE_DIR:
        os.chmod(path, PRIVATE_DIR)
    return path


def stat_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o7777


def unusable(folder: Path, exc: OSError) -> TierFolderError:
    return TierFolderError(f"the KV disk tier folder {folder} cannot be used: "
                           f"{exc.strerror or exc} (set [cache.disk] dir / --kv-disk-dir to a "
                           "folder this user can write)")


def try_lock(path: Path) -> int | None:
    """An exclusive flock on ``path`` with this pid written in it (held until the fd
    closes), or None when another process (or another fd of this one) holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def lock_holder(path: Path) -> str:
    """The pid written in the lock file ``path`` ("unknown" when there is none)."""
    try:
        return path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def take_lock(path: Path) -> int:
    """``try_lock(path)``; TierFolderError when another process (or engine) holds it."""
    fd = try_lock(path)
    if fd is None:
        raise TierFolderError(
            f"the KV disk tier folder {path.parent} is in use by another radixgate server "
            f"(pid {lock_holder(path)}): give each server, and each replica, its own folder")
    return fd


def open_locked(folder: Path) -> int:
    """``folder`` made private and locked: the lock's fd (closing it releases the folder);
    TierFolderError when it cannot be created or written, or another server holds it."""
    try:
        make_private_dir(folder)
        return take_lock(folder / "lock")
    except TierFolderError:
        raise
    except OSError as exc:
        raise unusable(folder, exc) from exc


def remove_temporary_files(folder: Path) -> int:
    """Delete the ``*.tmp`` files an interrupted atomic write left directly in ``folder``
    (a ``kill -9`` between write and rename); returns how many."""
    removed = 0
    for entry in os.scandir(folder):
        if entry.name.endswith(".tmp") and entry.is_file(follow_symlinks=False):
            Path(entry.path).unlink(missing_ok=True)
            removed += 1
    return removed


@dataclass(slots=True)
class OtherModel:
    """Another fingerprint's subfolder in the same tier folder: its bytes count against
    the shared budget until it is dropped (least recently used first)."""

    folder: Path
    nbytes: int
    last_used: float


def other_models(folder: Path, current: str) -> list[OtherModel]:
    """The model subfolders of ``folder`` other than ``current``, least recently used
    first (the manifest's mtime, else the folder's)."""
    root = folder / MODELS
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        if entry.name == current or not entry.is_dir():
            continue
        manifest = entry / "tier.json"
        used = (manifest if manifest.exists() else entry).stat().st_mtime
        found.append(OtherModel(entry, folder_bytes(entry), used))
    found.sort(key=lambda model: model.last_used)
    return found


def folder_bytes(folder: Path) -> int:
    total = 0
    for path, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(path, name)).st_size
            except OSError:
                pass
    return total


def delete_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
