"""API keys -> tenants, namespaces and per-tenant request-rate limits
(docs/ARCHITECTURE.md section 4).

A request authenticates with ``x-api-key: KEY`` or ``Authorization: Bearer KEY``. Every
configured key is compared with ``hmac.compare_digest`` (all of them, always), so timing
does not reveal which key prefix matched. With no keys configured the server is
single-tenant: every request is tenant ``default`` with admin rights (the CLI then refuses
a non-loopback host).

The cache namespace is derived here, never taken from the client: a hash of the
length-prefixed pair (tenant, cache_salt), so ("org_1", "2345") != ("org_12345", "").
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import math
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from radixgate.gateway.config import GatewayConfig, TenantConfig

DEFAULT_TENANT = "default"
ADMIN_TENANT = "admin"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a tenant (with its limits) and whether it may use admin routes."""

    tenant: str
    is_admin: bool
    limits: TenantConfig


class AuthError(Exception):
    """No key, or a key no tenant owns (401)."""


def namespace_for(tenant: str, cache_salt: str | None = None) -> str:
    """Cache namespace of (tenant, salt): sha256 over length-prefixed UTF-8 fields."""
    h = hashlib.sha256()
    for part in (tenant, cache_salt or ""):
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return "ns_" + h.hexdigest()[:32]


def extract_api_key(headers: Mapping[str, str], query: Mapping[str, str] | None = None
                    ) -> str | None:
    """The key from ``x-api-key``, ``Authorization: Bearer``, Gemini's ``x-goog-api-key``
    or its ``?key=`` query parameter (``query``: the URL's, where it may be read); None when
    none is set."""
    for name in ("x-api-key", "x-goog-api-key"):
        key = headers.get(name)
        if key:
            return key.strip()
    if query is not None and query.get("key"):
        return query["key"].strip()
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


class KeyRing:
    """Resolves API keys to principals in constant time over all configured keys."""

    def __init__(self, config: GatewayConfig):
        self._entries: list[tuple[bytes, Principal]] = []
        admin_limits = TenantConfig(name=ADMIN_TENANT, max_running=1 << 30,
                                    max_pinned_tokens=1 << 60, requests_per_minute=0)
        for key in config.admin_keys:
            self._entries.append((key.encode(), Principal(ADMIN_TENANT, True, admin_limits)))
        for tenant in config.tenants:
            for key in tenant.api_keys:
                self._entries.append((key.encode(), Principal(tenant.name, False, tenant)))
        self.open = not self._entries
        self._open_principal = Principal(DEFAULT_TENANT, True, TenantConfig(
            name=DEFAULT_TENANT, max_running=1 << 30, max_pinned_tokens=1 << 60,
            requests_per_minute=0))
        self.tenants = {t.name: t for t in config.tenants}

    def authenticate(self, headers: Mapping[str, str],
                     query: Mapping[str, str] | None = None) -> Principal:
        """Principal for the request's key; raises AuthError when the key is missing/unknown."""
        if self.open:
            return self._open_principal
        key = extract_api_key(headers, query)
        if key is None:
            raise AuthError("missing API key: send x-api-key, Authorization: Bearer or "
                            "x-goog-api-key")
        given = key.encode()
        found: Principal | None = None
        for stored, principal in self._entries:   # no early exit: constant time over keys
            if hmac.compare_digest(stored, given):
                found = principal
        if found is None:
            raise AuthError("invalid API key")
        return found


class RateLimiter:
    """Sliding 60-second window of request start times per tenant."""

    WINDOW_S = 60.0

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._starts: dict[str, collections.deque[float]] = collections.defaultdict(
            collections.deque)

    def try_acquire(self, tenant: str, per_minute: int) -> float | None:
        """Record a request and return None, or return seconds to wait (request not recorded)."""
        if per_minute <= 0:
            return None
        now = self._clock()
        starts = self._starts[tenant]
        while starts and starts[0] <= now - self.WINDOW_S:
            starts.popleft()
        if len(starts) >= per_minute:
            return max(1.0, math.ceil(starts[0] + self.WINDOW_S - now))
        starts.append(now)
        return None
