"""Start ``radixgate serve`` as a subprocess on a free loopback port: the one launcher of the
tests and the benchmarks.

A ``ServerSpec`` says what the server looks like (the tests' defaults: the tiny model with a
tiny KV budget and context, so eviction and preemption happen; ``bench_spec`` gives the
benchmarks' defaults: the default model, 1 GB of KV, 8k context, roomy tenant limits).
``ServerProcess(spec, workdir).start()`` writes the TOML config (docs/USAGE.md, Config file)
with ``ADMIN_KEY`` and one key per tenant (``tenant_key``), spawns the server, waits for
``GET /health`` to answer 200 and hands back itself (``base_url``); ``stop()`` sends SIGTERM,
then SIGKILL after a grace period, and returns the exit code. Logs go to
``workdir/server.log``. With ``spec.record_replies`` the server runs through
``benchmarks.replies``, which logs every reply's token ids to ``workdir/replies.jsonl``
(``reply_log``).
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ADMIN_KEY = "sk-admin-radixgate-0001"
DEFAULT_TENANTS = ("acme", "beta", "gamma", "delta", "org_1", "org_12345")
REPO_ROOT = Path(__file__).resolve().parent.parent

# The server variants compared side by side (extra CLI flags of ``radixgate serve``).
VARIANTS = {
    "radixgate": (),
    "cache_off": ("--no-prefix-cache",),
    "page_rounded": ("--page-rounded-match",),
    "plain_lru": ("--policy", "lru"),       # eviction without credits (pressure runs)
}
DEFAULT_VARIANTS = ("radixgate", "cache_off", "page_rounded")


def tenant_key(tenant: str) -> str:
    """The API key the generated config gives ``tenant``."""
    return f"sk-{tenant}-radixgate-key"


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports free now (held together while picked, so never the same
    one twice); take them just before the server that binds them starts."""
    held = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


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
        time.sleep(0.05)         # start-to-healthy is a benchmark figure: poll finely
    raise TimeoutError(f"server not healthy after {timeout_s}s:\n{log_tail()}")


def radixgate_command() -> list[str]:
    script = Path(sys.executable).with_name("radixgate")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from radixgate.gateway.cli import main; main()"]


@dataclass(frozen=True)
class ServerSpec:
    """What the server looks like. Defaults: the tests' (tiny model, tiny KV budget)."""

    kv_cache_gb: float = 0.002
    max_model_len: int = 512
    block_size: int = 16
    kv_dtype: str = "auto"          # "float32": a test whose capacity arithmetic is in float32 tokens
    max_queue: int = 256
    request_timeout_s: float = 120.0
    shutdown_grace_s: float = 8.0
    tenants: tuple[str, ...] = DEFAULT_TENANTS
    max_running: int = 64
    max_pinned_tokens: int = 128
    requests_per_minute: int = 0
    extra_args: tuple[str, ...] = ()
    # per-tenant settings that replace the ones above: ((tenant, ((name, value), ...)), ...)
    tenant_overrides: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()
    # more [server] keys, as TOML values: (("strict_max_tokens", "true"), ...)
    server_settings: tuple[tuple[str, str], ...] = ()
    # [cluster] keys, as TOML values: (("routed_ttl_s", "0"),)
    cluster_settings: tuple[tuple[str, str], ...] = ()
    tiny: bool = True              # False: the default model (SmolLM2-135M) at its real size
    record_replies: bool = False   # log every reply's token ids (benchmarks.replies)


def bench_spec(extra_args: Sequence[str] = (), tenants: Sequence[str] = ("default",), *,
               tiny: bool = False, kv_cache_gb: float = 1.0, max_model_len: int = 8192,
               record_replies: bool = False) -> ServerSpec:
    """The benchmarks' server: the default model unless ``tiny``, room for long runs (a
    queue of 1,024, 30-minute requests, 200k pinned tokens per tenant)."""
    return ServerSpec(kv_cache_gb=kv_cache_gb, max_model_len=max_model_len, max_queue=1024,
                      request_timeout_s=1800.0, shutdown_grace_s=20.0, tenants=tuple(tenants),
                      max_pinned_tokens=200_000, extra_args=tuple(extra_args), tiny=tiny,
                      record_replies=record_replies)


def config_toml(spec: ServerSpec) -> str:
    """The TOML text (docs/USAGE.md, Config file) for ``spec`` (host/port come from flags)."""
    lines = [
        "[server]",
        f"max_queue = {spec.max_queue}",
        f"request_timeout_s = {spec.request_timeout_s}",
        f"shutdown_grace_s = {spec.shutdown_grace_s}",
        *(f"{name} = {value}" for name, value in spec.server_settings),
        "[model]",
        'aliases = ["claude-*", "gpt-*", "gemini-*"]',
        f"max_model_len = {spec.max_model_len}",
        "[cache]",
        f"kv_cache_gb = {spec.kv_cache_gb}",
        f"block_size = {spec.block_size}",
        f"kv_dtype = {json.dumps(spec.kv_dtype)}",
        "[admin]",
        f"api_keys = [{json.dumps(ADMIN_KEY)}]",
        *(["[cluster]"] if spec.cluster_settings else []),
        *(f"{name} = {value}" for name, value in spec.cluster_settings),
    ]
    overrides = dict(spec.tenant_overrides)
    for tenant in spec.tenants:
        settings = {"max_running": spec.max_running, "max_pinned_tokens": spec.max_pinned_tokens,
                    "requests_per_minute": spec.requests_per_minute,
                    **dict(overrides.get(tenant, ()))}
        lines += [f"[tenants.{tenant}]", f"api_keys = [{json.dumps(tenant_key(tenant))}]"]
        lines += [f"{name} = {value}" for name, value in settings.items()]
    return "\n".join(lines) + "\n"


@dataclass
class ServerProcess:
    """One ``radixgate serve`` subprocess; logs go to ``workdir/server.log`` (a fresh
    temporary folder unless given). Also a context manager (start, then stop)."""

    spec: ServerSpec = field(default_factory=ServerSpec)
    workdir: Path | None = None
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "server.log"

    @property
    def reply_log(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "replies.jsonl"

    def serve_args(self) -> list[str]:
        """The ``radixgate serve ...`` arguments (after the program)."""
        assert self.workdir is not None
        return ["serve", *(["--tiny"] if self.spec.tiny else []),
                "--config", str(self.workdir / "radixgate.toml"),
                "--host", "127.0.0.1", "--port", str(self.port),
                "--kv-cache-gb", str(self.spec.kv_cache_gb),
                "--max-model-len", str(self.spec.max_model_len),
                "--block-size", str(self.spec.block_size), *self.spec.extra_args]

    def command(self) -> list[str]:
        if self.spec.record_replies:
            return [sys.executable, "-m", "benchmarks.replies", str(self.reply_log),
                    *self.serve_args()]
        return radixgate_command() + self.serve_args()

    def start(self, timeout_s: float = 240.0) -> "ServerProcess":
        """Write the config, spawn the server, wait until /health answers 200 (on ``port``
        where the caller picked it with the server's other ports, else a free one)."""
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="radixgate-server-"))
        (self.workdir / "radixgate.toml").write_text(config_toml(self.spec))
        self.port = self.port or free_port()
        env = dict(os.environ)
        if self.spec.record_replies:   # benchmarks.replies is found from any folder
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                              env.get("PYTHONPATH")]))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.workdir, env=env)
        try:
            wait_healthy(self.proc, self.base_url, timeout_s, self.log_tail)
        except TimeoutError:
            self.kill()
            raise
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send_sigterm(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int | None:
        """Exit code, or None when the process is still running after ``timeout_s``."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait, then SIGKILL if needed; returns the exit code after SIGTERM."""
        if self.proc is None:
            return None
        self.send_sigterm()
        code = self.wait(timeout_s)
        if code is None:
            self.kill()
        return code

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(timeout=10)

    def rss_bytes(self) -> int:
        """Resident memory of the server process (psutil)."""
        import psutil
        return psutil.Process(self.proc.pid).memory_info().rss

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (all its threads): the
        compute a workload cost, much less sensitive than wall time to other load."""
        import psutil
        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return "<no log>"

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
