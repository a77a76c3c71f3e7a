"""Start ``radixgate serve --tiny`` as a subprocess on a free loopback port.

A test builds a ``ServerSpec`` (tiny KV budget and context so eviction and preemption
happen), ``ServerProcess(spec, workdir).start()`` writes the TOML config (docs/USAGE.md,
Config file) with an admin key and several tenant keys, waits for ``GET /health`` to answer
200 and hands back the base URL. ``stop()`` sends SIGTERM and returns the exit code.

``shared_server(config, spec)`` starts one server per distinct spec per pytest session
(stored in ``config.stash``) so several test modules reuse it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from benchmarks.launch import free_port, radixgate_command, wait_healthy

ADMIN_KEY = "sk-admin-reliability-0001"
DEFAULT_TENANTS = ("acme", "beta", "gamma", "delta", "org_1", "org_12345")


def tenant_key(tenant: str) -> str:
    """The API key the generated config gives ``tenant``."""
    return f"sk-{tenant}-reliability-key"


@dataclass(frozen=True)
class ServerSpec:
    """What the test server looks like. Defaults: tiny KV budget (eviction under load)."""

    kv_cache_gb: float = 0.002
    max_model_len: int = 512
    block_size: int = 16
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


def config_toml(spec: ServerSpec) -> str:
    """The TOML text (docs/USAGE.md, Config file) for ``spec`` (host/port come from flags)."""
    lines = [
        "[server]",
        f"max_queue = {spec.max_queue}",
        f"request_timeout_s = {spec.request_timeout_s}",
        f"shutdown_grace_s = {spec.shutdown_grace_s}",
        *(f"{name} = {value}" for name, value in spec.server_settings),
        "[model]",
        'aliases = ["claude-*", "gpt-*"]',
        f"max_model_len = {spec.max_model_len}",
        "[cache]",
        f"kv_cache_gb = {spec.kv_cache_gb}",
        f"block_size = {spec.block_size}",
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
    """One ``radixgate serve`` subprocess (``--tiny`` unless the spec says otherwise); logs
    go to ``workdir/server.log``."""

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

    def command(self) -> list[str]:
        assert self.workdir is not None
        return radixgate_command() + [
            "serve", *(["--tiny"] if self.spec.tiny else []),
            "--config", str(self.workdir / "radixgate.toml"),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--kv-cache-gb", str(self.spec.kv_cache_gb),
            "--max-model-len", str(self.spec.max_model_len),
            "--block-size", str(self.spec.block_size), *self.spec.extra_args]

    def start(self, timeout_s: float = 180.0) -> "ServerProcess":
        """Write the config, spawn the server, wait until /health answers 200."""
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="radixgate-rel-"))
        (self.workdir / "radixgate.toml").write_text(config_toml(self.spec))
        self.port = free_port()
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self.workdir, env=dict(os.environ))
        log.close()
        self._wait_healthy(timeout_s)
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        try:
            wait_healthy(self.proc, self.base_url, timeout_s, self.log_tail)
        except TimeoutError:
            self.kill()
            raise

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

    def log_tail(self, n_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n_chars:]
        except OSError:
            return "<no log>"


def shared_server(config, spec: ServerSpec) -> ServerProcess:
    """One running server per spec for the whole pytest session (stopped at session end).

    ``config`` is ``pytestconfig``; the servers live in ``config.stash``."""
    servers = config.stash.setdefault(_SHARED_KEY, {})
    server = servers.get(spec)
    if server is None or not server.alive():
        server = ServerProcess(spec).start()
        servers[spec] = server
        config.add_cleanup(server.stop)
    return server


_SHARED_KEY: "pytest.StashKey[dict]" = pytest.StashKey[dict]()
