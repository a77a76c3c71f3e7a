"""The test suite's view of the one server launcher (benchmarks/launch.py: ``ServerSpec``,
``ServerProcess``, ``ADMIN_KEY``, ``tenant_key``), plus ``shared_server(config, spec)``: one
server per distinct spec per pytest session (stored in ``config.stash``), so several test
modules reuse it.
"""
from __future__ import annotations

import pytest

from benchmarks.launch import (ADMIN_KEY, DEFAULT_TENANTS, ServerProcess, ServerSpec,
                               config_toml, tenant_key)

__all__ = ["ADMIN_KEY", "DEFAULT_TENANTS", "ServerProcess", "ServerSpec", "config_toml",
           "shared_server", "tenant_key"]


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
