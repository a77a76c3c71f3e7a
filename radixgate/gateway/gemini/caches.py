"""Gemini's explicit caches: POST/GET /v1beta/cachedContents, GET/PATCH/DELETE
/v1beta/cachedContents/{id} (cache_store.py keeps the handles).

Create renders the cache's prompt (system instruction, tools, turns) as a request would,
computes it once and pins it in the tenant's namespace with a breakpoint at its end for the
cache's TTL (``ttl`` as ``"300s"``, or ``expireTime``; default an hour); the answer is the
``CachedContent`` (name, model, displayName, usageMetadata.totalTokenCount, createTime,
updateTime, expireTime). A prompt under ``MIN_CACHE_TOKENS`` tokens is a 400, as Gemini has a
minimum. Requests naming it (``cachedContent``) pin it again for its remaining time; PATCH
moves its expiry (the next use pins it that long); DELETE unpins it. A cache counts against
the tenant's pin share like any breakpoint.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import re

from aiohttp import web

from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.gemini.cache_store import (CACHES, MAX_PER_TENANT, STORES, CacheHandle,
                                                  CacheStore, handle_prefix)
from radixgate.gateway.gemini.convert import CachedPrefix, convert_prompt
from radixgate.gateway.gemini.schemas import (CachedContentCreate, CachedContentPatch,
                                              PromptFields)
from radixgate.gateway.http_util import parse_body, principal_of, state_of
from radixgate.gateway.pipeline import Ask, admit, prompt_tokens
from radixgate.gateway.auth import namespace_for
from radixgate.gateway.openai.choices import results
from radixgate.gateway.state_dir import state_folder

MIN_CACHE_TOKENS = 64
DEFAULT_TTL_S = 3600.0
MAX_TTL_S = 7 * 86400.0
MAX_PAGE = 100
_TTL = re.compile(r"^(\d+(?:\.\d+)?)s$")


def add_routes(app: web.Application) -> None:
    from radixgate.gateway.http_util import STATE
    app[CACHES] = STORES[app[STATE]] = CacheStore(state_folder(app[STATE].config))
    app.router.add_post("/v1beta/cachedContents", create)
    app.router.add_get("/v1beta/cachedContents", list_caches)
    app.router.add_get("/v1beta/cachedContents/{id}", get)
    app.router.add_patch("/v1beta/cachedContents/{id}", patch)
    app.router.add_delete("/v1beta/cachedContents/{id}", delete)


def parse_expiry(ttl: str | None, expire_time: str | None, now: float,
                 default: float | None = DEFAULT_TTL_S) -> float | None:
    """Seconds since the epoch when a cache expires: from ``ttl`` ("300s") or
    ``expireTime`` (RFC 3339), or ``default`` from now; within ``MAX_TTL_S``."""
    if ttl is not None and expire_time is not None:
        raise ApiError(Kind.BAD_REQUEST, "set either ttl or expireTime, not both", param="ttl")
    if ttl is not None:
        found = _TTL.match(ttl)
        if found is None or float(found.group(1)) <= 0:
            raise ApiError(Kind.BAD_REQUEST, f"ttl: {ttl!r} is not a duration such as '300s'",
                           param="ttl")
        expiry = now + float(found.group(1))
    elif expire_time is not None:
        try:
            expiry = dt.datetime.fromisoformat(expire_time.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise ApiError(Kind.BAD_REQUEST, f"expireTime: {expire_time!r} is not an RFC 3339 "
                           "time", param="expireTime") from None
        if expiry <= now:
            raise ApiError(Kind.BAD_REQUEST, "expireTime is in the past", param="expireTime")
    elif default is None:
        return None
    else:
        expiry = now + default
    if expiry - now > MAX_TTL_S:
        raise ApiError(Kind.BAD_REQUEST, f"a cache lives at most {MAX_TTL_S / 86400:g} days",
                       param="ttl")
    return expiry


def _rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat().replace(
        "+00:00", "Z")


def cached_content_body(handle: CacheHandle) -> dict:
    return {"name": handle.name, "model": f"models/{handle.model}",
            "displayName": handle.display_name,
            "usageMetadata": {"totalTokenCount": handle.token_count},
            "createTime": _rfc3339(handle.create_time),
            "updateTime": _rfc3339(handle.update_time),
            "expireTime": _rfc3339(handle.expire_time)}


async def create(request: web.Request) -> web.Response:
    store = request.app[CACHES]
    now = store.clock()
    expiry: list[float] = []

    def ask(state, principal, body: CachedContentCreate) -> Ask:
        if store.count(principal.tenant) >= MAX_PER_TENANT:
            raise ApiError(Kind.RATE_LIMIT, f"a tenant holds at most {MAX_PER_TENANT} caches: "
                           "delete one first")
        expiry.append(parse_expiry(body.ttl, body.expire_time, now))
        prompt = PromptFields.model_validate(body.model_dump(by_alias=True))
        converted = convert_prompt(PromptFields(), None, CachedPrefix(prompt, expiry[0] - now))
        return Ask("gemini", body, converted, max_tokens=1)

    admitted = await admit(request, CachedContentCreate, ask)
    size = _pinned_size(admitted)
    if size < MIN_CACHE_TOKENS:
        raise ApiError(Kind.BAD_REQUEST, f"Cached content is too small. total_token_count="
                       f"{size}, min_total_token_count={MIN_CACHE_TOKENS}", param="contents")
    await results(admitted.generations)          # computed and pinned once it finishes
    body, state = admitted.body, admitted.state
    handle = CacheHandle(store.new_name(), admitted.principal.tenant, body.model,
                         body.display_name or "", _prompt_json(body), size, now, now, expiry[0])
    store.add(handle)
    return web.json_response(cached_content_body(handle))


def _pinned_size(admitted) -> int:
    """Tokens up to the cache's end (its breakpoint) in the rendered prompt."""
    breakpoints = admitted.prompts[0].breakpoints
    return breakpoints[-1].offset if breakpoints else 0


def _prompt_json(body: CachedContentCreate) -> dict:
    return PromptFields.model_validate(body.model_dump(by_alias=True)).model_dump(
        by_alias=True, exclude_none=True)


def _handle(request: web.Request) -> CacheHandle:
    handle = request.app[CACHES].get(principal_of(request).tenant, request.match_info["id"])
    if handle is None:
        raise ApiError(Kind.NOT_FOUND, "CachedContent not found (or permission denied): "
                       f"cachedContents/{request.match_info['id']}")
    return handle


async def get(request: web.Request) -> web.Response:
    return web.json_response(cached_content_body(_handle(request)))


async def list_caches(request: web.Request) -> web.Response:
    tenant = principal_of(request).tenant
    unknown = set(request.query) - {"pageSize", "pageToken", "key"}
    if unknown:
        raise ApiError(Kind.BAD_REQUEST, f"unknown query parameter {sorted(unknown)[0]!r}")
    try:
        size = min(MAX_PAGE, max(1, int(request.query.get("pageSize", MAX_PAGE))))
        start = int(request.query.get("pageToken") or 0)
    except ValueError:
        raise ApiError(Kind.BAD_REQUEST, "pageSize and pageToken must be numbers") from None
    handles = request.app[CACHES].list(tenant)
    page = handles[start:start + size]
    answer: dict = {"cachedContents": [cached_content_body(h) for h in page]}
    if start + size < len(handles):
        answer["nextPageToken"] = str(start + size)
    return web.json_response(answer)


async def patch(request: web.Request) -> web.Response:
    handle = _handle(request)
    body = await parse_body(request, CachedContentPatch)
    store = request.app[CACHES]
    expiry = parse_expiry(body.ttl, body.expire_time, store.clock(), default=None)
    if expiry is None and body.display_name is None:
        raise ApiError(Kind.BAD_REQUEST, "nothing to update: set ttl or expireTime",
                       param="ttl")
    store.touch(handle, expiry or handle.expire_time, body.display_name)
    return web.json_response(cached_content_body(handle))


async def delete(request: web.Request) -> web.Response:
    handle = _handle(request)
    request.app[CACHES].remove(handle)
    await unpin(request, handle)
    return web.json_response({})


async def unpin(request: web.Request, handle: CacheHandle) -> None:
    """Take the cache's pin off its prompt (it stays cached until evicted)."""
    state = state_of(request)
    if state.engine is None:
        return
    principal = principal_of(request)
    converted = convert_prompt(PromptFields(), None, handle_prefix(handle))
    tokens = await prompt_tokens(state, principal, converted)
    await asyncio.wrap_future(state.engine.unpin(namespace_for(principal.tenant),
                                                 tokens[:handle.token_count]))
