"""Start ``radixgate serve`` as a subprocess on a free loopback port, for the benchmarks.

``BenchServer(variant_args, tenants).start()`` writes a TOML config (docs/USAGE.md, Config file)
with an admin key and one key per tenant, spawns the server with the default real model
(or ``--tiny``), waits for ``GET /health`` and hands back the base URL; ``stop()`` sends
SIGTERM (then SIGKILL after a grace period). Logs go to ``workdir/server.log``. With
``record_replies`` the server runs through ``benchmarks.replies``, which logs every reply's
token ids to ``workdir/replies.jsonl`` (``reply_log``).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ADMIN_KEY = "sk-admin-bench-0001"

# The server variants compared side by side (extra CLI flags of ``radixgate serve``).
VARIANTS = {
    "radixgate": (),
    "cache_off": ("--no-prefix-cache",),
    "page_rounded": ("--page-rounded-match",),
    "plain_lru": ("--policy", "lru"),       # eviction without credits (pressure runs)
}
DEFAULT_VARIANTS = ("radixgate", "cache_off", "page_rounded")


def tenant_key(tenant: str) -> str:
    return f"sk-bench-{tenant}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, base_url: str, timeout_s: float,
                 log_tail: Callable[[], str]) -> None:
    """Poll ``GET /health`` until it answers 200. Raises RuntimeError if the process exits
    first and TimeoutError after ``timeout_s`` (the caller stops the process)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_tail()}")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    raise TimeoutError(f"server not healthy after {timeout_s}s:\n{log_tail()}")


def config_toml(tenants: list[str], kv_cache_gb: float, max_model_len: int) -> str:
    lines = ["[server]", "max_queue = 1024", "request_timeout_s = 1800",
             "[model]", 'aliases = ["claude-*", "gpt-*"]', f"max_model_len = {max_model_len}",
             "[cache]", f"kv_cache_gb = {kv_cache_gb}",
             "[admin]", f"api_keys = [{json.dumps(ADMIN_KEY)}]"]
    for tenant in tenants:
        lines += [f"[tenants.{tenant}]", f"api_keys = [{json.dumps(tenant_key(tenant))}]",
                  "max_running = 64", "max_pinned_tokens = 200000", "requests_per_minute = 0"]
    return "\n".join(lines) + "\n"


def radixgate_command() -> list[str]:
    script = Path(sys.executable).with_name("radixgate")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from radixgate.gateway.cli import main; main()"]


REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class BenchServer:
    extra_args: tuple[str, ...] = ()
    tenants: list[str] = field(default_factory=lambda: ["default"])
    tiny: bool = False
    kv_cache_gb: float = 1.0
    max_model_len: int = 8192
    record_replies: bool = False
    workdir: Path | None = None
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def reply_log(self) -> Path:
        return self.workdir / "replies.jsonl"

    def start(self, timeout_s: float = 300.0) -> "BenchServer":
        self.workdir = self.workdir or Path(tempfile.mkdtemp(prefix="radixgate-bench-"))
        config = self.workdir / "radixgate.toml"
        config.write_text(config_toml(self.tenants, self.kv_cache_gb, self.max_model_len))
        self.port = free_port()
        serve = ["serve", "--config", str(config), "--host", "127.0.0.1", "--port",
                 str(self.port), *(["--tiny"] if self.tiny else []), *self.extra_args]
        env = dict(os.environ)
        if self.record_replies:
            command = [sys.executable, "-m", "benchmarks.replies", str(self.reply_log), *serve]
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                              env.get("PYTHONPATH")]))
        else:
            command = radixgate_command() + serve
        with open(self.workdir / "server.log", "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir, env=env)
        self._wait_healthy(timeout_s)
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        try:
            wait_healthy(self.proc, self.base_url, timeout_s, self.log_tail)
        except TimeoutError:
            self.stop()
            raise

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (all its threads): the
        compute a workload cost, much less sensitive than wall time to other load."""
        import psutil
        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    def log_tail(self, n_chars: int = 3000) -> str:
        try:
            return (self.workdir / "server.log").read_text(errors="replace")[-n_chars:]
        except OSError:
            return "<no log>"

    def __enter__(self) -> "BenchServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
