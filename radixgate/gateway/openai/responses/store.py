"""Stored responses for ``previous_response_id`` (OpenAI Responses API), in memory.

Each tenant has its own least-recently-used map, bounded by count and by stored tokens;
an entry expires ``ttl_s`` after it was stored. A lookup sees only the caller's own
tenant's entries, so another tenant's id is simply not found (404). Nothing is written to
disk: a restart forgets every response.
"""
from __future__ import annotations

import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

DEFAULT_TTL_S = 3600.0
DEFAULT_MAX_PER_TENANT = 256
DEFAULT_MAX_TOKENS_PER_TENANT = 4_000_000     # 16 MB of token ids per tenant at most


@dataclass(frozen=True, slots=True)
class StoredTurn:
    """What a continuation needs: the token ids of the turn as the engine saw them
    (``tokens`` = prompt + output ids as generated), the chat-template roles of the
    prompt's messages (system first when there is one: the glue after the answer and
    before new messages depends on them), what the prompt's system part was built from
    (``instructions``, ``tools``), its cache salt, and the response object returned."""

    response_id: str
    tokens: array
    roles: tuple[str, ...]
    instructions: str | None
    tools: tuple[dict, ...]
    cache_salt: str | None
    body: dict


@dataclass(slots=True)
class _Entry:
    turn: StoredTurn
    expires_at: float


class ResponseStore:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_per_tenant: int = DEFAULT_MAX_PER_TENANT,
                 max_tokens_per_tenant: int = DEFAULT_MAX_TOKENS_PER_TENANT,
                 clock: Callable[[], float] = time.monotonic):
        self.ttl_s = ttl_s
        self.max_per_tenant = max_per_tenant
        self.max_tokens_per_tenant = max_tokens_per_tenant
        self._clock = clock
        self._tenants: dict[str, OrderedDict[str, _Entry]] = {}
        self._tokens: dict[str, int] = {}

    def put(self, tenant: str, turn: StoredTurn) -> None:
        """Stores ``turn``; the tenant's least recently used entries go when it is over
        its count or token bound (a turn larger than the token bound is not stored)."""
        if len(turn.tokens) > self.max_tokens_per_tenant:
            return
        entries = self._tenants.setdefault(tenant, OrderedDict())
        self._drop(tenant, turn.response_id)
        entries[turn.response_id] = _Entry(turn, self._clock() + self.ttl_s)
        self._tokens[tenant] = self._tokens.get(tenant, 0) + len(turn.tokens)
        self._expire(tenant)
        while (len(entries) > self.max_per_tenant
               or self._tokens[tenant] > self.max_tokens_per_tenant):
            self._drop(tenant, next(iter(entries)))

    def get(self, tenant: str, response_id: str) -> StoredTurn | None:
        """The tenant's live turn with that id (now the most recently used), else None."""
        self._expire(tenant)
        entries = self._tenants.get(tenant)
        entry = entries.get(response_id) if entries else None
        if entry is None:
            return None
        entries.move_to_end(response_id)
        return entry.turn

    def delete(self, tenant: str, response_id: str) -> bool:
        return self._drop(tenant, response_id)

    def count(self, tenant: str) -> int:
        self._expire(tenant)
        return len(self._tenants.get(tenant, ()))

    def _expire(self, tenant: str) -> None:
        """Drops the tenant's expired entries (a scan of at most ``max_per_tenant``)."""
        now = self._clock()
        entries = self._tenants.get(tenant) or {}
        for response_id in [k for k, e in entries.items() if e.expires_at <= now]:
            self._drop(tenant, response_id)

    def _drop(self, tenant: str, response_id: str) -> bool:
        entries = self._tenants.get(tenant)
        entry = entries.pop(response_id, None) if entries is not None else None
        if entry is None:
            return False
        self._tokens[tenant] -= len(entry.turn.tokens)
        if not entries:
            del self._tenants[tenant]
            del self._tokens[tenant]
        return True
