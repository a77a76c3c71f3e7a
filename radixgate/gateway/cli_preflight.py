"""Refusals ``radixgate serve`` and ``generate`` make before anything loads.

A port that another process holds, or a model path that does not exist, would otherwise
show only after the model loaded (seconds to minutes), as a traceback. Each check raises
a ``ConfigError``: the CLI prints it as one line and exits with status 2.
"""
from __future__ import annotations

import socket
from pathlib import Path

from radixgate.gateway.config import ConfigError, GatewayConfig


def check_model_path(config: GatewayConfig) -> None:
    """The model file or folder exists (``default`` and ``--tiny`` use the installed
    default model, which the loader checks). Skipped when the engines run on a Ray cluster
    this process joins: the path is read on that cluster's machines."""
    path = config.model.path
    if path == "default" or config.model.tiny or config.cluster.ray_address:
        return
    if not Path(path).expanduser().exists():
        raise ConfigError(f"model path {path} does not exist (--model or [model] path)")


def check_port_free(host: str, port: int) -> None:
    """Every address ``host`` resolves to can listen on ``port`` now: bound and released
    at once, with the socket options the server's own listener uses (SO_REUSEADDR; IPv6
    sockets IPv6-only), so a port held by a listening process fails here as it would there."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise ConfigError(f"cannot listen on {host}:{port}: "
                                  f"{exc.strerror or exc} (--port or [server] port)") from None
