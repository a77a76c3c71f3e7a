"""Storage backends of a KV tier: where records' bytes live. ``KVTier`` (tier.py) drives
them from its writer and loader threads; the index (radixgate/kv/tiers/index.py) stays
beside, so the same tier runs over a folder (``DiskBackend``) or host memory
(``MemoryBackend``, the tier below GPU memory on a machine with one).

A backend stores whole records (records.py) under their ``TierRecord``; ``put`` is atomic
(a reader sees the whole record or none), ``read`` returns None for a record that is gone.

DiskBackend keeps the records of the current model in its own subfolder of the tier
folder (the layout: folders.py). Each record is written to a temporary name and renamed
into place (a ``kill -9`` leaves at most a temporary file, removed at the next start); files
are 0600, folders 0700. Record order across restarts is the files' modification times (a
load touches its file).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from radixgate.kv.tiers.index import TierRecord

from .folders import (MODELS, PRIVATE_FILE, OtherModel, TierFolderError, delete_folder,
                      make_private_dir, open_locked, other_models, remove_temporary_files,
                      unusable)
from .records import FORMAT_VERSION

__all__ = ["DiskBackend", "MemoryBackend", "TierBackend", "TierFolderError"]

log = logging.getLogger(__name__)
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


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
    other_bytes: int                                        # other models' share of the budget
    def take_oldest_other(self) -> OtherModel | None: ...   # under the tier's lock
    def drop_other(self, model: OtherModel) -> None: ...    # outside it


class MemoryBackend:
    """Records in host memory (nothing survives the process; no other models)."""

    other_bytes = 0

    def __init__(self):
        self.data: dict[bytes, bytes] = {}
        self.spaces: dict[bytes, str] = {}

    def take_oldest_other(self) -> OtherModel | None:
        return None

    def drop_other(self, model: OtherModel) -> None:
        pass

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
    """Records as files under ``folder``, in the subfolder of ``fingerprint`` (layout:
    folders.py). Other fingerprints' subfolders stay (their bytes count against the shared
    budget: ``other_bytes``) until room is needed, least recently used first."""

    def __init__(self, folder: str | os.PathLike, fingerprint: bytes, description: str = ""):
        self.folder = Path(folder)
        self._lock_fd = open_locked(self.folder)
        try:
            self.model_folder = self.folder / MODELS / fingerprint.hex()
            self.blocks = self.model_folder / "blocks"
            self._open_model_folder(fingerprint, description)
            self.others = other_models(self.folder, fingerprint.hex())
            self.other_bytes = sum(model.nbytes for model in self.others)
        except OSError as exc:
            self.close()
            raise unusable(self.folder, exc) from exc
        except BaseException:
            self.close()
            raise

    @staticmethod
    def check_folder(folder: str | os.PathLike) -> None:
        """Raise ``TierFolderError`` unless ``folder`` can be created, written and locked
        now (the lock is released again)."""
        os.close(open_locked(Path(folder)))

    # ---- start -------------------------------------------------------------------------
    def _open_model_folder(self, fingerprint: bytes, description: str) -> None:
        """This model's subfolder, private; the layout before per-model subfolders (records
        straight under ``DIR/blocks``) moves into it when its fingerprint is this one, else
        is dropped; leftover temporary files go."""
        remove_temporary_files(self.folder)
        self._adopt_flat_layout(fingerprint)
        for folder in (self.folder / MODELS, self.model_folder, self.blocks):
            make_private_dir(folder)
        remove_temporary_files(self.model_folder)
        manifest = {"format": FORMAT_VERSION, "fingerprint": fingerprint.hex(),
                    "model": description}
        write_atomic(self.model_folder / "tier.json", [json.dumps(manifest).encode()])

    def _adopt_flat_layout(self, fingerprint: bytes) -> None:
        old_manifest, old_blocks = self.folder / "tier.json", self.folder / "blocks"
        if not old_manifest.exists() and not old_blocks.exists():
            return
        try:
            found = json.loads(old_manifest.read_text())
        except (OSError, ValueError):
            found = {}
        same = (found.get("format") == FORMAT_VERSION
                and found.get("fingerprint") == fingerprint.hex())
        if same and old_blocks.is_dir() and not self.blocks.exists():
            make_private_dir(self.model_folder)
            os.replace(old_blocks, self.blocks)
            old_retention = self.folder / "retention.json"
            if old_retention.exists():
                os.replace(old_retention, self.model_folder / "retention.json")
        else:
            shutil.rmtree(old_blocks, ignore_errors=True)
            (self.folder / "retention.json").unlink(missing_ok=True)
        old_manifest.unlink(missing_ok=True)

    def scan(self) -> list[TierRecord]:
        """Every record file (parsed from its name and size, read lazily: its checksum is
        checked when it is loaded), oldest first; leftover temporary files are removed and
        every namespace folder is made private."""
        found: list[tuple[float, TierRecord]] = []
        for space_dir in self.blocks.iterdir():
            if not space_dir.is_dir():
                continue
            make_private_dir(space_dir)
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

    # ---- other models ------------------------------------------------------------------
    def take_oldest_other(self) -> OtherModel | None:
        """The least recently used other model, no longer counted (``other_bytes``); its
        folder is the caller's to delete (``drop_other``), outside any lock."""
        if not self.others:
            return None
        model = self.others.pop(0)
        self.other_bytes -= model.nbytes
        return model

    def drop_other(self, model: OtherModel) -> None:
        log.info("KV disk tier %s: dropped the blocks of another model (%s, %.1f MiB) for "
                 "room", self.folder, model.folder.name, model.nbytes / 2**20)
        delete_folder(model.folder)

    # ---- records -----------------------------------------------------------------------
    def put(self, record: TierRecord, prefix: bytes, parts: Sequence[memoryview]) -> None:
        path = self._path(record)
        if not path.parent.is_dir():
            make_private_dir(path.parent)
        write_atomic(path, (prefix, *parts))

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
        if space is not None:
            shutil.rmtree(self.blocks / space, ignore_errors=True)
            return
        for entry in list(self.blocks.iterdir()):
            shutil.rmtree(entry, ignore_errors=True)

    def load_retention(self) -> dict[bytes, tuple[float, float]]:
        try:
            raw = json.loads((self.model_folder / "retention.json").read_text())
            return {bytes.fromhex(k): (float(v[0]), float(v[1])) for k, v in raw.items()}
        except (OSError, ValueError, TypeError, IndexError):
            return {}

    def save_retention(self, retention: dict[bytes, tuple[float, float]]) -> None:
        data = {k.hex(): [until, ttl] for k, (until, ttl) in retention.items()}
        write_atomic(self.model_folder / "retention.json", [json.dumps(data).encode()])

    def close(self) -> None:
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            try:
                os.utime(self.model_folder / "tier.json")   # this model was used until now
            except (OSError, AttributeError):
                pass
            os.close(fd)       # releases the flock

    def _path(self, record: TierRecord) -> Path:
        name = (f"{record.digest.hex()}.f" if record.full else
                f"{record.digest.hex()}.{record.parent.hex()}.{record.count}.t")
        return self.blocks / record.space / name


def write_atomic(path: Path, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
    """Write ``chunks`` to ``path`` (0600) so that a reader sees the old file or the whole
    new one: into a temporary name of this process and thread (two writers of one path
    never share it; a ``kill -9`` leaves at most a ``*.tmp``, removed at the next start),
    then renamed into place."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
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
