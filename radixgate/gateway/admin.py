"""Operations routes: / (links), /health, /metrics, /v1/cache/stats, cache flush/prefixes,
integrity.

Admin only: POST /v1/cache/flush, GET|POST|DELETE /v1/cache/prefixes,
GET /v1/admin/integrity. A tenant key may read /v1/cache/stats and /metrics, scoped to
its own tenant. A flush naming a tenant no key belongs to, or a ``cache_salt`` under which
nothing is cached, is a 404.

A prefix is given as ``tokens`` (ids), ``text`` (raw text, tokenized as is) or ``system``
(a system prompt, rendered exactly as requests render it: the tokens up to the end of the
system message). ``tenant`` null publishes into the ``public`` namespace (tenants with
``use_public_prefixes`` reuse it); a tenant name pins in that tenant's namespace (with its
optional ``cache_salt``), computing the prefix first if it is not cached.
"""
from __future__ import annotations

import asyncio
import html
from typing import Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from radixgate.gateway.gemini.cache_store import store_of
from radixgate.gateway.auth import ADMIN_TENANT, DEFAULT_TENANT, namespace_for
from radixgate.kv import PUBLIC_NAMESPACE
from radixgate.gateway.cache_stats import build_stats, template_headers
from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.http_util import (parse_body, principal_of, read_body, require_admin,
                                         state_of)
from radixgate.gateway.prompt_parts import TTL_SECONDS
from radixgate.gateway.render import ChatMessage, Conversation, Piece, render_prompt


class FlushRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: str | None = None
    cache_salt: str | None = None
    public: bool = False


class PrefixRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[int] | None = Field(default=None, min_length=1)
    text: str | None = Field(default=None, min_length=1)
    system: str | None = Field(default=None, min_length=1)
    tenant: str | None = None
    cache_salt: str | None = None
    ttl_s: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)
    ttl: Literal["5m", "1h"] | None = None


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/cache/stats", cache_stats)
    app.router.add_post("/v1/cache/flush", flush)
    app.router.add_get("/v1/cache/prefixes", list_prefixes)
    app.router.add_post("/v1/cache/prefixes", add_prefix)
    app.router.add_delete("/v1/cache/prefixes", remove_prefix)
    app.router.add_get("/v1/admin/integrity", integrity)


async def index(request: web.Request) -> web.Response:
    """GET /: where to go from here (the dashboard, the API description, the endpoints);
    a small HTML page for a browser, JSON otherwise. It holds no data: no key needed."""
    links = index_links(state_of(request))
    if "text/html" in request.headers.get("accept", ""):
        return web.Response(text=_index_html(links), content_type="text/html")
    return web.json_response(links)


def index_links(state) -> dict:
    return {"name": "radixgate", "model": state.model_name,
            "dashboard": "/dashboard", "openapi": "/openapi.json", "health": "/health",
            "metrics": "/metrics", "cache_stats": "/v1/cache/stats",
            "endpoints": {"anthropic": "/v1/messages", "openai_chat": "/v1/chat/completions",
                          "openai_responses": "/v1/responses",
                          "gemini": "/v1beta/models/{model}:generateContent"},
            "docs": "docs/USAGE.md in the radixgate source tree (endpoints, settings, limits)"}


def _index_html(links: dict) -> str:
    rows = "".join(f'<li><a href="{href}">{label}</a></li>' for label, href in (
        ("Cache dashboard", links["dashboard"]), ("API description (OpenAPI)", links["openapi"]),
        ("Health", links["health"]), ("Metrics (Prometheus)", links["metrics"])))
    model = html.escape(links["model"])
    return (f"<!doctype html><html><head><meta charset=\"utf-8\"><title>radixgate</title>"
            f"</head><body><h1>radixgate</h1><p>Serving {model}: Anthropic "
            f"<code>/v1/messages</code>, OpenAI <code>/v1/chat/completions</code> and "
            f"<code>/v1/responses</code>, Gemini <code>/v1beta</code>.</p><ul>{rows}</ul>"
            f"<p>Documentation: {html.escape(links['docs'])}.</p></body></html>")


async def health(request: web.Request) -> web.Response:
    state = state_of(request)
    if state.draining:
        return web.json_response({"status": "draining"}, status=503)
    if state.load_error:
        return web.json_response({"status": "error", "error": state.load_error}, status=503)
    if not state.ready:
        return web.json_response({"status": "loading"}, status=503)
    body = {"status": "ok", "model": state.model_name}
    core = getattr(state.engine, "core", None)           # replicas: each says it in its log
    if core is not None:
        body["deterministic"] = core.deterministic
    return web.json_response(body)


async def metrics(request: web.Request) -> web.Response:
    state, principal = state_of(request), principal_of(request)
    if state.ready and not state.draining:
        await asyncio.wrap_future(state.engine.request_snapshot())   # fresh gauges
    body = state.metrics.render(None if principal.is_admin else principal.tenant)
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def cache_stats(request: web.Request) -> web.Response:
    state, principal = state_of(request), principal_of(request)
    engine = state.require_engine()
    decode = (lambda ids: engine.tokenizer.decode(ids)) if principal.is_admin else None
    snapshot = await asyncio.wrap_future(engine.request_snapshot())   # taken between steps
    scope = None if principal.is_admin else principal.tenant
    headers = await asyncio.to_thread(template_headers, state.tokenizer)   # cached
    stats = build_stats(snapshot, state.book, model=state.model_name, tenant=scope,
                        decode=decode, headers=headers)
    stats["miss_reasons"] = state.diagnostics.reasons(scope)
    stats["explicit_caches"] = explicit_caches(state, principal)
    return web.json_response(stats)


def explicit_caches(state, principal) -> list[dict]:
    """The caller's Gemini caches (an admin's: every tenant's), oldest first."""
    store = store_of(state)
    tenants = {h.tenant for h in store.handles.values()} if principal.is_admin else \
        {principal.tenant}
    handles = sorted((h for tenant in tenants for h in store.list(tenant)),
                     key=lambda h: (h.create_time, h.name))
    return [{"name": h.name, "display_name": h.display_name, "tenant": h.tenant,
             "tokens": h.token_count, "expires_in_s": round(h.expire_time - store.clock())}
            for h in handles]


async def flush(request: web.Request) -> web.Response:
    require_admin(request)
    state = state_of(request)
    engine = state.require_engine()
    body = await _optional_body(request, FlushRequest)
    namespace = await _flushed_namespace(state, engine, body)
    freed = await asyncio.wrap_future(engine.flush(namespace))
    await asyncio.wrap_future(engine.request_snapshot())
    return web.json_response({"flushed": True, "namespace": namespace, "freed_blocks": freed})


async def _flushed_namespace(state, engine, body: FlushRequest) -> str | None:
    """The namespace a flush names (None: every one); 404 for a tenant no key belongs to,
    or a ``cache_salt`` under which the cache (either tier) holds nothing."""
    if body.public:
        return PUBLIC_NAMESPACE
    if body.tenant is None:
        if body.cache_salt is not None:
            raise ApiError(Kind.BAD_REQUEST, "cache_salt names a namespace of a tenant: "
                           "give tenant too", param="cache_salt")
        return None
    if body.tenant not in known_tenants(state):
        raise ApiError(Kind.NOT_FOUND, f"tenant {body.tenant!r} does not exist (no API key "
                       "belongs to it)", param="tenant")
    namespace = namespace_for(body.tenant, body.cache_salt)
    if body.cache_salt is not None and not await asyncio.wrap_future(
            engine.holds_namespace(namespace)):
        raise ApiError(Kind.NOT_FOUND, f"nothing is cached under cache_salt "
                       f"{body.cache_salt!r} of tenant {body.tenant!r}", param="cache_salt")
    return namespace


def known_tenants(state) -> set[str]:
    """The tenants requests can come from: the configured ones, ``admin`` when admin keys
    exist, ``default`` on a server without keys."""
    config = state.config
    names = {t.name for t in config.tenants}
    if config.admin_keys:
        names.add(ADMIN_TENANT)
    if state.keyring.open:
        names.add(DEFAULT_TENANT)
    return names


async def _optional_body(request: web.Request, model):
    if request.can_read_body and (await read_body(request)).strip():
        return await parse_body(request, model)
    return model()


def _prefix_tokens(state, body: PrefixRequest) -> list[int]:
    given = [x for x in (body.tokens, body.text, body.system) if x is not None]
    if len(given) != 1:
        raise ApiError(Kind.BAD_REQUEST, "give exactly one of tokens, text or system")
    if body.tokens is not None:
        vocab = state.tokenizer.vocab_size
        if any(t < 0 or t >= vocab for t in body.tokens):
            raise ApiError(Kind.BAD_REQUEST, f"token ids must lie in [0, {vocab})", param="tokens")
        return list(body.tokens)
    if body.text is not None:
        return state.tokenizer.encode(body.text)
    conversation = Conversation(system=(Piece(body.system),),
                                messages=(ChatMessage("user", (Piece("."),)),))
    rendered = render_prompt(state.tokenizer, conversation)
    return rendered.tokens[:rendered.segment_ends[0]]


def _ttl_s(body: PrefixRequest) -> float:
    if body.ttl_s is not None:
        return body.ttl_s
    return TTL_SECONDS[body.ttl or "5m"]


async def add_prefix(request: web.Request) -> web.Response:
    require_admin(request)
    state = state_of(request)
    engine = state.require_engine()
    body = await parse_body(request, PrefixRequest)
    tokens = await asyncio.to_thread(_prefix_tokens, state, body)
    ttl_s = _ttl_s(body)
    if len(tokens) + 1 > engine.max_model_len:
        raise ApiError(Kind.BAD_REQUEST, f"prefix of {len(tokens)} tokens exceeds the context")
    if body.tenant is None or body.tenant == PUBLIC_NAMESPACE:
        namespace, owner = PUBLIC_NAMESPACE, PUBLIC_NAMESPACE
    else:
        namespace, owner = namespace_for(body.tenant, body.cache_salt), body.tenant
    finished = await asyncio.wrap_future(engine.publish(tokens, ttl_s, namespace, owner))
    if finished.error_kind is not None:
        raise ApiError(Kind.BAD_REQUEST, f"could not compute the prefix: {finished.error_message}")
    pinned = await asyncio.wrap_future(engine.pin(namespace, tokens, ttl_s, owner))
    await asyncio.wrap_future(engine.request_snapshot())
    return web.json_response({"namespace": namespace, "tenant": owner, "tokens": len(tokens),
                              "pinned_tokens": pinned, "ttl_s": ttl_s,
                              "cache_read_tokens": finished.usage.cache_read_tokens})


async def remove_prefix(request: web.Request) -> web.Response:
    require_admin(request)
    state = state_of(request)
    engine = state.require_engine()
    body = await parse_body(request, PrefixRequest)
    tokens = await asyncio.to_thread(_prefix_tokens, state, body)
    public = body.tenant is None or body.tenant == PUBLIC_NAMESPACE
    namespace = PUBLIC_NAMESPACE if public else namespace_for(body.tenant, body.cache_salt)
    removed = await asyncio.wrap_future(engine.unpin(namespace, tokens))
    await asyncio.wrap_future(engine.request_snapshot())
    return web.json_response({"namespace": namespace, "unpinned": bool(removed)})


async def list_prefixes(request: web.Request) -> web.Response:
    """Every unexpired pin: published (``public``) prefixes, admin pins and breakpoint pins."""
    require_admin(request)
    state = state_of(request)
    engine = state.require_engine()
    snapshot = await asyncio.wrap_future(engine.request_snapshot())
    pins = [{"tenant": p.tenant, "namespace": p.namespace, "tokens": p.length, "hits": p.hits,
             "pin_ttl_s": round(p.pin_ttl_s, 1),
             "preview": engine.tokenizer.decode(list(p.token_ids[:48]))[:160]}
            for p in snapshot.pins]
    return web.json_response({"data": pins})


async def integrity(request: web.Request) -> web.Response:
    require_admin(request)
    engine = state_of(request).require_engine()
    try:
        result = await asyncio.wrap_future(engine.check_integrity())
    except AssertionError as e:
        return web.json_response({"ok": False, "error": str(e)})
    return web.json_response({"ok": True, **result})
