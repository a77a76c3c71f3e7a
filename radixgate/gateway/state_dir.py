"""The gateway's state folder: what the gateway itself keeps across a restart (per-tenant
cache usage history, explicit cache handles), beside the KV disk tier's folder.

``[server] state_dir`` (``--state-dir``) names it; by default it is ``radixgate-state`` beside
``[cache.disk] dir`` (a server with a disk tier keeps its state next to its KV), and there is
none without either (the state then lives in memory only, for the process's life). The
tier's permission rule holds: every folder 0700 and every file 0600 whatever the umask
(``private_folder``, ``write_private``); files are replaced atomically (written beside,
then renamed), so a crash leaves the old file or the new one, never half of one.
"""
from __future__ import annotations

import os
from pathlib import Path

from radixgate.kv.tiers.disk.folders import PRIVATE_FILE, make_private_dir

DEFAULT_NAME = "radixgate-state"


def state_folder(config) -> Path | None:
    """The state folder for a ``GatewayConfig`` (created 0700), or None when there is none."""
    chosen = config.server.state_dir
    if not chosen and config.cache.disk.enabled:
        chosen = str(Path(config.cache.disk.dir).expanduser().resolve().parent / DEFAULT_NAME)
    if not chosen:
        return None
    return make_private_dir(Path(chosen).expanduser())


def private_folder(parent: Path, name: str) -> Path:
    """``parent / name`` created 0700."""
    return make_private_dir(parent / name)


def write_private(path: Path, data: bytes) -> None:
    """``data`` into ``path`` (0600), atomically: a temporary file beside it, then a rename."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, PRIVATE_FILE)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
