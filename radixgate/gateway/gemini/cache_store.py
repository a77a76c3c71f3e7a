"""Explicit caches (Gemini's ``cachedContents``) a tenant holds: handles to pinned prompts.

A handle names a prompt (system instruction, tools, turns) the server computed once and
pinned in the tenant's namespace until ``expire_time``; requests that name it reuse it
exactly. The store keeps each handle's prompt as the request sent it (to render it again),
its token count and its times; handles of other tenants are invisible (404, as an unknown
name). Bounded: ``MAX_PER_TENANT`` handles a tenant. With a state folder
(gateway/state_dir.py) the handles are saved in ``gemini/caches.json`` after each change and
read at start (expired ones dropped), so they survive a restart; the pinned K/V survives
only with the disk tier (a pin of an hour or more is written there at once; without a tier a
restarted server recomputes the prompt at the handle's first use).
"""
from __future__ import annotations

import json
import logging
import secrets
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from aiohttp import web

from radixgate.gateway.gemini.convert import CachedPrefix
from radixgate.gateway.gemini.schemas import PromptFields
from radixgate.gateway.state_dir import private_folder, write_private

log = logging.getLogger("radixgate.gateway")
MAX_PER_TENANT = 64
FILE = "caches.json"


@dataclass
class CacheHandle:
    """One explicit cache (times in seconds since the epoch)."""

    name: str                # "cachedContents/<id>"
    tenant: str
    model: str               # the model name it was created for (one the server serves)
    display_name: str
    prompt: dict             # PromptFields as the request sent it (camelCase)
    token_count: int         # tokens of the pinned prompt
    create_time: float       # seconds since the epoch
    update_time: float
    expire_time: float


def handle_prefix(handle: CacheHandle) -> CachedPrefix:
    """The handle's prompt, pinned for the rest of its life from now."""
    return CachedPrefix(PromptFields.model_validate(handle.prompt),
                        max(1.0, handle.expire_time - time.time()))


class CacheStore:
    """The handles of every tenant (the event loop's only: no locking)."""

    def __init__(self, folder: Path | None = None, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.path = private_folder(folder, "gemini") / FILE if folder is not None else None
        self.handles: dict[str, CacheHandle] = {}
        self._load()

    def add(self, handle: CacheHandle) -> None:
        self.handles[handle.name] = handle
        self._save()

    def new_name(self) -> str:
        return "cachedContents/" + secrets.token_hex(12)

    def count(self, tenant: str) -> int:
        return sum(1 for h in self._live() if h.tenant == tenant)

    def get(self, tenant: str, name: str) -> CacheHandle | None:
        """The tenant's live handle called ``name`` (with or without ``cachedContents/``)."""
        name = name if name.startswith("cachedContents/") else "cachedContents/" + name
        handle = self.handles.get(name)
        if handle is None or handle.tenant != tenant:
            return None
        if handle.expire_time <= self.clock():
            self.remove(handle)
            return None
        return handle

    def list(self, tenant: str) -> list[CacheHandle]:
        """The tenant's live handles, oldest first."""
        return sorted((h for h in self._live() if h.tenant == tenant),
                      key=lambda h: (h.create_time, h.name))

    def touch(self, handle: CacheHandle, expire_time: float, display_name: str | None) -> None:
        handle.expire_time = expire_time
        handle.update_time = self.clock()
        if display_name is not None:
            handle.display_name = display_name
        self._save()

    def remove(self, handle: CacheHandle) -> None:
        if self.handles.pop(handle.name, None) is not None:
            self._save()

    def expired(self) -> list[CacheHandle]:
        """Handles past their expiry (removed from the store)."""
        now = self.clock()
        gone = [h for h in self.handles.values() if h.expire_time <= now]
        for handle in gone:
            del self.handles[handle.name]
        if gone:
            self._save()
        return gone

    def _live(self) -> list[CacheHandle]:
        self.expired()
        return list(self.handles.values())

    def _save(self) -> None:
        if self.path is None:
            return
        data = json.dumps([asdict(h) for h in self.handles.values()]).encode()
        try:
            write_private(self.path, data)
        except OSError as exc:
            log.warning("gemini caches: could not save %s (%s)", self.path, exc)

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            rows = json.loads(self.path.read_text())
            handles = [CacheHandle(**row) for row in rows]
        except (OSError, ValueError, TypeError) as exc:
            log.warning("gemini caches: ignored an unreadable %s (%s)", self.path, exc)
            return
        now = self.clock()
        self.handles = {h.name: h for h in handles if h.expire_time > now}


CACHES = web.AppKey("gemini_caches", CacheStore)

# the store of each gateway (caches.add_routes registers it): the Anthropic and OpenAI
# routes reach explicit caches through their GatewayState (cross_api.py)
STORES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def store_of(state) -> CacheStore:
    return STORES[state]
