"""``is_loopback(host)``: whether a host name or address reaches this machine only (the KV
events' endpoint, the local Ray cluster's bind address)."""
from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (IPv4 or IPv6); False for any other name."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
