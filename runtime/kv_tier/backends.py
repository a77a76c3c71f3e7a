"""Storage backends of a KV tier: where records' bytes live. ``KVTier`` (tier.py) drives
them from its writer and loader threads; the index (radix_cache/tier_index.py) stays
beside, so the same tier runs over a folder (``DiskBackend``) or host memory
(``MemoryBackend``, the tier below GPU memory on a machine with one).

A backend stores whole records (records.py) under their ``TierRecord``; ``put`` is atomic
(a reader sees the whole record or none), ``read`` returns None for a record that is gone.

DiskBackend's folder::

    DIR/lock          held (flock) while a server uses DIR: a second one is refused
    DIR/tier.json     format version and model fingerprint; another fingerprint's blocks
                      are dropped at start (they could never be read)
    DIR/retention.json  digest -> [until, ttl_s] of pinned prefixes (wall clock)
    DIR/blocks/SPACE/DIGEST.f             a full block
    DIR/blocks/SPACE/DIGEST.PARENT.COUNT.t  a partly filled last block

Each record is written to a temporary name and renamed into place (a ``kill -9`` leaves at
most a temporary file, removed at the next start); files are 0600, folders 0700. Record
order across restarts is the files' modification times (a load touches its file).
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from radixgate.radix_cache.tier_index import TierRecord

from .records import FORMAT_VERSION

log = logging.getLogger(__name__)
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class TierFolderError(RuntimeError):
    """The disk tier's folder cannot be used (unwritable, or another server holds it)."""


class TierBackend(Protocol):
    def scan(self) -> list[TierRecord]: ...                 # held at start, oldest first
    def put(self, record: TierRecord, prefix: bytes, parts: Sequence[memoryview]) -> None: ...
    def read(self, record: TierRecord) -> bytearray | None: ...
    def touch(self, record: TierRecord) -> None: ...
    def delete(self, record: TierRecord) -> None: ...
    def purge(self, space: str | None) -> None: ...          # None: everything
    def load_retention(self) -> dict[bytes, tuple[float, float]]: ...
    def save_retention(self, retention: dict[bytes, tuple[float, float]]) -> None: ...
    def close(self) -> None: ...


class MemoryBackend:
    """Records in host memory (nothing survives the process)."""

    def __init__(self):
        self.data: dict[bytes, bytes] = {}
        self.spaces: dict[bytes, str] = {}

    def scan(self) -> list[TierRecord]:
        return []

    def put(self, record: TierRecord, prefix: bytes, parts: Sequence[memoryview]) -> None:
        self.data[record.digest] = prefix + b"".join(parts)
        self.spaces[record.digest] = record.space

    def read(self, record: TierRecord) -> bytearray | None:
        data = self.data.get(record.digest)
        return None if data is None else bytearray(data)

    def touch(self, record: TierRecord) -> None:
        pass

    def delete(self, record: TierRecord) -> None:
        self.data.pop(record.digest, None)
        self.spaces.pop(record.digest, None)

    def purge(self, space: str | None) -> None:
        for digest in [d for d, s in self.spaces.items() if space is None or s == space]:
            self.delete(TierRecord(digest, "", b"", 0, 0, True))

    def load_retention(self) -> dict[bytes, tuple[float, float]]:
        return {}

    def save_retention(self, retention: dict[bytes, tuple[float, float]]) -> None:
        pass

    def close(self) -> None:
        pass


class DiskBackend:
    """Records as files under ``folder`` (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike, fingerprint: bytes, description: str = ""):
        self.folder = Path(folder)
        self.blocks = self.folder / "blocks"
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._lock_fd = _take_lock(self.folder / "lock")
        except TierFolderError:
            raise
        except OSError as exc:
            raise TierFolderError(f"the KV disk tier folder {self.folder} cannot be used: "
                                  f"{exc.strerror or exc} (set [cache] disk_dir / "
                                  "--kv-disk-dir to a folder this user can write)") from exc
        try:
            self._check_manifest(fingerprint, description)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def check_folder(folder: str | os.PathLike) -> None:
        """Raise ``TierFolderError`` unless ``folder`` can be created, written and locked
        now (the lock is released again)."""
        path = Path(folder)
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(_take_lock(path / "lock"))
        except TierFolderError:
            raise
        except OSError as exc:
            raise TierFolderError(f"the KV disk tier folder {path} cannot be used: "
                                  f"{exc.strerror or exc} (set [cache] disk_dir / "
                                  "--kv-disk-dir to a folder this user can write)") from exc

    # ---- start -------------------------------------------------------------------------
    def _check_manifest(self, fingerprint: bytes, description: str) -> None:
        manifest = self.folder / "tier.json"
        wanted = {"format": FORMAT_VERSION, "fingerprint": fingerprint.hex()}
        try:
            found = json.loads(manifest.read_text())
        except (OSError, ValueError):
            found = None
        if found is not None and {k: found.get(k) for k in wanted} == wanted:
            return
        if found is not None or self.blocks.exists():
            log.warning("KV disk tier %s holds blocks of another model, KV layout or format "
                        "(%s): they are dropped, none can be read by this one", self.folder,
                        (found or {}).get("model", "unknown"))
            shutil.rmtree(self.blocks, ignore_errors=True)
            (self.folder / "retention.json").unlink(missing_ok=True)
        _write_atomic(manifest, json.dumps({**wanted, "model": description}).encode())

    def scan(self) -> list[TierRecord]:
        """Every record file (parsed from its name and size, read lazily: its checksum is
        checked when it is loaded), oldest first; leftover temporary files are removed."""
        found: list[tuple[float, TierRecord]] = []
        if not self.blocks.is_dir():
            return []
        for space_dir in self.blocks.iterdir():
            if not space_dir.is_dir():
                continue
            for entry in os.scandir(space_dir):
                if entry.name.endswith(".tmp"):
                    Path(entry.path).unlink(missing_ok=True)
                    continue
                record = _parse_name(space_dir.name, entry.name)
                if record is None:
                    continue
                stat = entry.stat()
                record.nbytes = stat.st_size
                found.append((stat.st_mtime, record))
        found.sort(key=lambda item: item[0])
        return [record for _, record in found]

    # ---- records -----------------------------------------------------------------------
    def put(self, record: TierRecord, prefix: bytes, parts: Sequence[memoryview]) -> None:
        path = self._path(record)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(prefix)
                for part in parts:
                    out.write(part)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def read(self, record: TierRecord) -> bytearray | None:
        try:
            with open(self._path(record), "rb") as source:
                data = bytearray(os.fstat(source.fileno()).st_size)
                source.readinto(data)
                return data
        except FileNotFoundError:
            return None

    def touch(self, record: TierRecord) -> None:
        try:
            os.utime(self._path(record))
        except OSError:
            pass

    def delete(self, record: TierRecord) -> None:
        self._path(record).unlink(missing_ok=True)

    def purge(self, space: str | None) -> None:
        shutil.rmtree(self.blocks if space is None else self.blocks / space, ignore_errors=True)

    def load_retention(self) -> dict[bytes, tuple[float, float]]:
        try:
            raw = json.loads((self.folder / "retention.json").read_text())
            return {bytes.fromhex(k): (float(v[0]), float(v[1])) for k, v in raw.items()}
        except (OSError, ValueError, TypeError, IndexError):
            return {}

    def save_retention(self, retention: dict[bytes, tuple[float, float]]) -> None:
        data = {k.hex(): [until, ttl] for k, (until, ttl) in retention.items()}
        _write_atomic(self.folder / "retention.json", json.dumps(data).encode())

    def close(self) -> None:
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            os.close(fd)       # releases the flock

    def _path(self, record: TierRecord) -> Path:
        name = (f"{record.digest.hex()}.f" if record.full else
                f"{record.digest.hex()}.{record.parent.hex()}.{record.count}.t")
        return self.blocks / record.space / name


def _take_lock(path: Path) -> int:
    """An exclusive flock on ``path`` (held until the fd closes); TierFolderError when
    another process (or engine) holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise TierFolderError(
            f"the KV disk tier folder {path.parent} is in use by another radixgate server "
            f"(pid {holder}): give each server, and each replica, its own folder") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _parse_name(space: str, name: str) -> TierRecord | None:
    parts = name.split(".")
    try:
        if len(parts) == 2 and parts[1] == "f":
            return TierRecord(bytes.fromhex(parts[0]), space, b"", 0, 0, True)
        if len(parts) == 4 and parts[3] == "t":
            return TierRecord(bytes.fromhex(parts[0]), space, bytes.fromhex(parts[1]),
                              int(parts[2]), 0, False)
    except ValueError:
        return None
    return None
