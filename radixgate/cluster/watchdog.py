"""The gateway's Ray watchdog: no process of the local Ray cluster outlives the gateway,
``kill -9`` included.

Ray ties the processes ``ray.init`` starts itself (GCS, raylet, dashboard, monitors) to the
driver with Linux's parent-death signal, and workers end when their raylet does; but the
raylet's own children, the dashboard and runtime-env agents, left without it, try to
report its death to the GCS (gone too) and linger for a minute, listening. This process,
started by the gateway before Ray (``start_watchdog``) with a pipe on its stdin, notes the
gateway's descendants every ``POLL_S``; when the pipe closes (the gateway exited, however
it exited) it ends those still running: SIGTERM, then SIGKILL after ``GRACE_S``.

It ignores SIGINT and SIGTERM: a Ctrl-C or a service manager's stop reaches the gateway's
whole process group, and the watchdog stays until the gateway is gone. It runs as a file
(``python .../watchdog.py PID``) and imports nothing from radixgate, so it starts the same
from a checkout or an installed package.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

POLL_S = 1.0
GRACE_S = 1.0      # the agents, stuck reporting to a GCS that is gone, ignore SIGTERM


def start_watchdog() -> subprocess.Popen:
    """The watchdog of this process; keep the returned Popen: closing its stdin (or this
    process ending) is what tells the watchdog to clean up (``stop_watchdog``)."""
    # -P: this file's folder (radixgate/cluster) does not go first on the module path
    return subprocess.Popen([sys.executable, "-P", os.path.abspath(__file__), str(os.getpid())],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)


def stop_watchdog(watchdog: subprocess.Popen, timeout_s: float = GRACE_S + 3.0) -> None:
    """The gateway stopped Ray itself: the watchdog ends what is left (nothing, normally)."""
    watchdog.stdin.close()
    try:
        watchdog.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        watchdog.kill()


def watch(gateway: int) -> None:
    while True:
        seen = _descendants(gateway)      # pid -> create time (a reused pid is not ours)
        if not _gateway_running(gateway):
            break
    end_processes(seen)


def _gateway_running(gateway: int) -> bool:
    """False once the pipe from the gateway closes or the gateway is no longer the parent;
    waits up to ``POLL_S``."""
    ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
    if ready and not os.read(sys.stdin.fileno(), 4096):
        return False
    return os.getppid() == gateway


def _descendants(pid: int) -> dict[int, float]:
    import psutil
    try:
        found = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    out = {}
    for proc in found:
        try:
            if proc.pid != os.getpid():
                out[proc.pid] = proc.create_time()
        except psutil.Error:
            continue
    return out


def end_processes(seen: dict[int, float]) -> None:
    """SIGTERM to the processes of ``seen`` still running (and their children), SIGKILL
    to those left after ``GRACE_S``."""
    import psutil
    alive = []
    for pid, created in seen.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                alive.append(proc)
                alive += proc.children(recursive=True)
        except psutil.Error:
            continue
    for proc in alive:
        _signal(proc, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [proc for proc in alive if _running(proc)]
    for proc in alive:
        _signal(proc, signal.SIGKILL)


def _running(proc) -> bool:
    """Not ended; a zombie has ended (its new parent, maybe a container's init that does
    not reap, collects it)."""
    import psutil
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(proc, sig: int) -> None:
    import psutil
    try:
        proc.send_signal(sig)
    except psutil.Error:
        pass


def _import_psutil() -> None:
    """psutil: installed, else the copy Ray ships (``ray/thirdparty_files``)."""
    try:
        import psutil  # noqa: F401
    except ImportError:
        import importlib.util
        ray = importlib.util.find_spec("ray")
        for folder in ray.submodule_search_locations if ray else ():
            sys.path.append(os.path.join(folder, "thirdparty_files"))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _import_psutil()
    watch(int(sys.argv[1]))
