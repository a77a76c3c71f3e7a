"""The local Ray cluster of ``radixgate serve --replicas 2``, locked down: every process of
the gateway's tree and of its Ray cluster listens on loopback only, the start logs nothing
the user cannot act on, and however the gateway ends (a service manager's SIGTERM to the
whole process group, a Ctrl-C, ``kill -9``) no Ray process outlives it.

Each server runs in its own session and process group, as a service manager runs a unit
(``start_new_session``), so a signal to the group reaches the gateway and Ray's processes
and nothing of the test's. Three Ray starts in all: the stops cannot share one."""
from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from benchmarks.launch import REPO_ROOT, free_port, wait_healthy
from tests.support.server import ServerProcess, ServerSpec, config_toml

pytest.importorskip("ray.serve")

SPEC = ServerSpec(kv_cache_gb=0.004, extra_args=("--replicas", "2", "--threads", "1"),
                  tenants=("acme",), shutdown_grace_s=10.0)
EXPECTED = ("gcs_server", "raylet", "DashboardAgent", "RuntimeEnvAgent", "ServeReplica")


class GroupServer(ServerProcess):
    """A server that leads its own session and process group; ``family`` is its process
    tree (the gateway, the watchdog, Ray's processes and workers) taken once it is up."""

    family: tuple | list = ()

    def start(self, timeout_s: float = 240.0) -> "GroupServer":
        self.workdir = Path(tempfile.mkdtemp(prefix="radixgate-lockdown-"))
        (self.workdir / "radixgate.toml").write_text(config_toml(self.spec))
        self.port = free_port()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir, start_new_session=True)
        try:
            wait_healthy(self.proc, self.base_url, timeout_s, self.log_tail)
        except (TimeoutError, RuntimeError):
            self.kill()
            raise
        root = psutil.Process(self.proc.pid)
        self.family = [root] + root.children(recursive=True)
        return self

    def signal_group(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def left_after(self, seconds: float) -> list[str]:
        """The processes of ``family`` still running after up to ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            left = [p for p in self.family if _running(p)]
            if not left or time.monotonic() >= deadline:
                return [f"{p.pid} {_name(p)}" for p in left]
            time.sleep(0.1)

    def end_leftovers(self) -> None:
        """Whatever a failed test leaves is ended here, by pid: only this server's processes."""
        for proc in self.family:
            if _running(proc):
                proc.kill()

    def log(self) -> str:
        """The server's output (stderr and stdout), without the access log."""
        text = self.log_path.read_text(errors="replace")
        return "\n".join(line for line in text.splitlines() if "radixgate.access" not in line)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _name(proc: psutil.Process) -> str:
    """The process's name and the start of its command line: the name first, so a long
    install path (a CI checkout) cannot cut the part the checks look for."""
    try:
        return f"{proc.name()}: {' '.join(proc.cmdline())[:80]}"
    except psutil.Error:
        return "?"


def listening(proc: psutil.Process) -> list[tuple[str, int]]:
    try:
        return [(c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        return []


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)     # ::ffff:127.0.0.1
    return (mapped or address).is_loopback


def test_the_watchdog_ends_what_outlives_a_killed_gateway():
    """No Ray here: a stand-in gateway starts the watchdog and a child in its own session
    (as the raylet's agents end up: not ended by anyone), then dies of SIGKILL."""
    from radixgate.cluster.watchdog import POLL_S
    stand_in = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from radixgate.cluster.watchdog import start_watchdog\n"
        "watchdog = start_watchdog()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
        " start_new_session=True)\n"
        "print(child.pid, watchdog.pid, flush=True)\n"
        "time.sleep(120)\n")], stdout=subprocess.PIPE, text=True)
    child, watchdog = (psutil.Process(int(pid)) for pid in stand_in.stdout.readline().split())
    try:
        time.sleep(3 * POLL_S)                     # the watchdog has noted the child
        assert _running(child)
        stand_in.kill()
        stand_in.wait()
        deadline = time.monotonic() + 15
        while (_running(child) or _running(watchdog)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(child) and not _running(watchdog)
    finally:
        for proc in (child, watchdog):
            if _running(proc):
                proc.kill()


def test_a_local_cluster_bound_beyond_loopback_needs_ray_s_token_authentication(monkeypatch):
    from radixgate.cluster.local_ray import init_local_ray, is_loopback
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.5")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(RuntimeError, match="token authentication"):
        init_local_ray("10.0.0.5", 1, {})
    with pytest.raises(RuntimeError, match="not an address of this machine"):
        init_local_ray("0.0.0.0", 1, {})


def test_help_and_usage_say_what_a_joined_ray_cluster_needs_secured():
    from radixgate.gateway.cli import build_parser
    serve = next(a for a in build_parser()._actions if a.dest == "command").choices["serve"]
    help_text = " ".join(serve.format_help().split())
    usage = " ".join((REPO_ROOT / "docs" / "USAGE.md").read_text().split())
    for text in (help_text, usage):
        assert "RAY_AUTH_MODE=token" in text and "~/.ray/auth_token" in text
    assert "securing it is yours" in help_text and "securing it is yours" in usage


@pytest.fixture(scope="module")
def server():
    srv = GroupServer(SPEC).start()
    start_log = srv.log()
    sockets = {f"{p.pid} {_name(p)}": listening(p) for p in srv.family}
    try:
        yield srv, start_log, sockets
    finally:
        srv.kill()
        srv.end_leftovers()


def test_every_process_of_the_replicas_listens_on_loopback_only(server):
    srv, _, sockets = server
    names = " ".join(sockets)
    assert all(kind in names for kind in EXPECTED), names
    assert sum(len(found) for found in sockets.values()) > 10, sockets
    outside = {proc: [s for s in found if not is_loopback(s[0])]
               for proc, found in sockets.items()}
    assert not any(outside.values()), {proc: s for proc, s in outside.items() if s}


def test_the_replicas_start_logs_nothing_the_user_cannot_act_on(server):
    _, start_log, _ = server
    assert "engine ready" in start_log, start_log
    assert " 0 KV blocks" not in start_log, start_log
    assert "WARNING" not in start_log, start_log
    for unactionable in ("Connecting to existing Serve app", "SIGTERM handler is not set",
                         "Token authentication is enabled", "Started <ray.serve"):
        assert unactionable not in start_log


def test_sigterm_to_the_process_group_ends_every_process_within_the_drain_time(server):
    """As a service manager stops a unit: Ray's own processes get the signal too (and end
    at once); the gateway does not wait for a Serve controller that cannot answer."""
    srv, _, _ = server
    srv.signal_group(signal.SIGTERM)
    left = srv.left_after(SPEC.shutdown_grace_s)
    assert left == [], (left, srv.log()[-4000:])
    assert srv.proc.wait(timeout=5) == 0
    assert "Controller failed to shut down" not in srv.log()


def test_ctrl_c_ends_every_process_and_prints_no_ray_task_failure():
    """A terminal's Ctrl-C (SIGINT to the foreground process group): the gateway drains and
    stops the deployment and Ray; no Ray task failure or traceback is printed."""
    srv = GroupServer(SPEC).start()
    try:
        srv.signal_group(signal.SIGINT)
        left = srv.left_after(60)
        log = srv.log()
        assert left == [], (left, log[-4000:])
        assert srv.proc.wait(timeout=5) == 0
        stopping = log[log.index("draining"):]
        for failure in ("(raylet)", "Task ", "Traceback", "ERROR"):
            assert failure not in stopping, stopping
    finally:
        srv.kill()
        srv.end_leftovers()


def test_kill_9_of_the_gateway_leaves_no_ray_process_behind():
    """The watchdog ends what Ray's parent-death handling leaves (the raylet's dashboard and
    runtime-env agents lingered for a minute, listening)."""
    srv = GroupServer(SPEC).start()
    try:
        assert any("DashboardAgent" in _name(p) for p in srv.family)
        srv.proc.kill()
        srv.proc.wait(timeout=10)
        left = srv.left_after(15)
        assert left == [], left
    finally:
        srv.end_leftovers()
