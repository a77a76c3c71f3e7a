"""GET /v1/cache/stats: the JSON described in docs/USAGE.md (Endpoints), scoped to the caller.

An admin sees the whole server and every tenant, with a text ``preview`` of each hot
prefix. A tenant sees only itself: its tokens, hit rate, TTFT, history, running requests,
pinned tokens and its own prefixes (no preview). Server-wide block, tree and eviction
counts describe every tenant's traffic, so a tenant gets them as zeros (``total`` blocks,
the capacity, is configuration and stays); the prefill rate it gets is rounded. Extra keys beyond the design: ``tenant`` (the
scope, null for admin), ``prefill_tokens_per_s``, the 5m/1h split of ``cache_creation``
in every ``tokens``, ``requests.preemptions`` (server-wide, admin only), ``tree.namespaces``
(live cache namespaces, admin only), a per-second ``history`` in each ``tenants.<name>`` entry,
``kv_dtype`` and ``capacity`` (blocks, tokens, bytes per token and bytes of the KV cache in
that dtype: configuration, so a tenant sees it too; with replicas the sum over them, each with
its own ``kv_cache_gb``: ``replicas`` and ``bytes_per_replica`` say so), ``tiers`` (the KV held in memory and
in the disk tier: blocks, bytes, prompt tokens served from each, the disk tier's loads,
writes, drops by reason and whether its disk is full; server-wide, so admin only: a tenant
gets zeros, and ``enabled`` and the disk budget, which are configuration: with replicas
``budget_bytes`` is the deployment's, split evenly, ``budget_bytes_per_replica`` one's share),
``replicas``
(scale-out: each
engine replica's blocks, hit rate, running and waiting; the other counts are their sums;
empty with one engine), ``engine`` (steps since start, seconds inside them and in the model
forward; admin only), ``spec`` (speculative decoding: verify steps, draft tokens checked and
kept, the acceptance rate and tokens emitted per verify step; admin only), ``pools`` (a
model with sliding-window layers keeps their K/V in a pool of its own: each pool's layers,
blocks, tokens and bytes per token, configuration; and for admins its free, cached, in-use
blocks and the window data tombstoned; null without a window pool). The route adds
``miss_reasons`` (per minute of the last hour, how many of the caller's requests read their
whole prompt, up to new content, less because a pin expired or the cache evicted it, or were
the first of their kind: diagnostics.py) and ``explicit_caches`` (the caller's Gemini caches:
name, display_name, tenant, tokens, expires_in_s; an admin's: every tenant's).
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

from radixgate.gateway.render import (ChatMessage, Conversation, Piece, TemplateError,
                                      render_prompt)
from radixgate.gateway.usage_book import UsageBook, percentile

PREVIEW_TOKENS = 48
PREVIEW_CHARS = 160


def build_stats(snapshot, book: UsageBook, *, model: str, tenant: str | None,
                decode: Callable[[list[int]], str] | None,
                headers: Sequence[Sequence[int]] = ()) -> dict:
    """``tenant`` None = admin view; ``decode`` renders previews (admin only); ``headers``:
    the chat template's openings (``template_headers``), which ``top_prefixes`` leaves out."""
    totals = book.totals(tenant)
    admin = tenant is None
    running, waiting = _queue_counts(snapshot, tenant)
    return {
        "model": model,
        "tenant": tenant,
        "block_size": snapshot.block_size,
        "kv_dtype": snapshot.kv_dtype,
        "capacity": _capacity(snapshot),
        "uptime_s": round(book.uptime_s(), 3),
        "blocks": _blocks(snapshot, admin),
        "tree": _tree(snapshot, tenant),
        "requests": {"running": running, "waiting": waiting,
                     "finished": totals.finished, "errors": totals.errors,
                     "preemptions": snapshot.preemptions if admin else 0},
        "tokens": totals.tokens(),
        "hit_rate": round(totals.hit_rate, 6),
        "ttft_ms": {"hit": _quantiles(totals.ttft_hit_ms), "miss": _quantiles(totals.ttft_miss_ms)},
        "evictions": {reason: (snapshot.evictions.get(reason, 0) if admin else 0)
                      for reason in ("lru", "ttl", "flush")},
        "tenants": _tenants(snapshot, book, tenant),
        "top_prefixes": _prefixes(snapshot, tenant, decode if admin else None, headers),
        "history": book.history(tenant),
        "prefill_tokens_per_s": _prefill_rate(snapshot.prefill_tokens_per_s, admin),
        "tiers": _tiers(snapshot, admin),
        "pools": _pools(snapshot, admin),
        "replicas": _replicas(snapshot, admin),
        "engine": _engine(snapshot, admin),
        "spec": _spec(snapshot, admin),
    }


def _spec(snapshot, admin: bool) -> dict:
    """Speculative decoding's counts (radixgate/runtime/engine/spec.py): server-wide, so admin only.
    Each verify step emits its kept drafts and one token of its own."""
    counts = snapshot.spec if admin else {}
    steps, drafted, accepted = (counts.get(k, 0) for k in ("steps", "drafted", "accepted"))
    return {"verify_steps": steps, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": round(accepted / drafted, 6) if drafted else 0.0,
            "tokens_per_step": round((accepted + steps) / steps, 6) if steps else 0.0}


def _engine(snapshot, admin: bool) -> dict:
    """Steps since start and the time inside them, of which in the model's forward (the
    rest is scheduling, sampling and emitting): server-wide, so admin only."""
    if not admin:
        return {"steps": 0, "step_s": 0.0, "forward_s": 0.0}
    return {"steps": snapshot.steps, "step_s": round(snapshot.step_time_s, 6),
            "forward_s": round(snapshot.forward_time_s, 6)}


DISK_COUNTS = ("blocks", "bytes", "retained_blocks", "hit_tokens", "loads", "loaded_blocks",
               "load_bytes", "writes", "write_bytes", "evicted")


def _tiers(snapshot, admin: bool) -> dict:
    """Memory and disk side by side (see the module docstring)."""
    tier = snapshot.tier
    hits = getattr(snapshot, "hit_tokens", None) or {}
    held = snapshot.blocks.cached + snapshot.blocks.pinned
    block_bytes = snapshot.block_size * snapshot.kv_bytes_per_token
    memory = {"blocks": held, "bytes": held * block_bytes, "hit_tokens": hits.get("memory", 0)}
    disk = {"enabled": tier is not None,
            "budget_bytes": tier.budget_bytes if tier is not None else 0,
            "budget_bytes_per_replica": (tier.budget_bytes // _replica_count(snapshot)
                                         if tier is not None else 0),
            **{key: getattr(tier, key, 0) for key in DISK_COUNTS},
            "load_gb_per_s": _rate(tier.load_bytes, tier.load_s) if tier is not None else None,
            "drops": dict(tier.drops) if tier is not None else {},
            "full": bool(tier is not None and tier.full)}
    if not admin:
        memory = dict.fromkeys(memory, 0)
        disk.update({key: 0 for key in DISK_COUNTS}, drops={}, full=False, load_gb_per_s=None)
    return {"memory": memory, "disk": disk}


def _rate(nbytes: int, seconds: float) -> float | None:
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 and nbytes > 0 else None


def _replicas(snapshot, admin: bool) -> list[dict]:
    """Scale-out (``--replicas N``): each engine replica, the others' sum above. A tenant
    gets the list with capacity only, as for ``blocks``."""
    out = []
    for r in getattr(snapshot, "replicas", ()):
        item = {"replica": r.replica, "blocks": _blocks_of(r.blocks, admin),
                "hit_rate": r.hit_rate if admin else 0.0,
                "running": r.running if admin else 0, "waiting": r.waiting if admin else 0}
        if admin:
            item.update(in_flight=r.in_flight, indexed_blocks=r.indexed_blocks, stale=r.stale)
        out.append(item)
    return out


def _prefill_rate(rate: float, admin: bool) -> float:
    """The measured prefill speed is a model/hardware figure, shown to tenants too (their
    "prefill time saved" needs it), but rounded to 2 significant digits for them: the exact
    moving average moves with every prefill step, and its fine steps would hint at the sizes
    of other tenants' prompts; the coarse value only says that the server is busy, which
    a tenant's own latencies already tell it."""
    if admin or rate <= 0:
        return round(max(rate, 0.0), 1)
    return float(round(rate, 1 - math.floor(math.log10(rate))))


def _quantiles(samples) -> dict:
    """p50/p95 in ms; null (not 0) without samples."""
    return {"p50": percentile(samples, 50), "p95": percentile(samples, 95)}


def _queue_counts(snapshot, tenant: str | None) -> tuple[int, int]:
    if tenant is None:
        return snapshot.running, snapshot.waiting
    counts = snapshot.tenants.get(tenant)
    return (counts.running, counts.waiting) if counts else (0, 0)


def _capacity(snapshot) -> dict:
    """How much the KV cache holds in its dtype (bytes per token include 8-bit scales;
    ``bytes``: both pools where the window layers have their own). With replicas each has
    its own ``kv_cache_gb``: the counts are their sum, ``bytes_per_replica`` one's share."""
    tokens = snapshot.blocks.total * snapshot.block_size
    total = snapshot.kv_bytes or tokens * snapshot.kv_bytes_per_token
    replicas = _replica_count(snapshot)
    return {"blocks": snapshot.blocks.total, "tokens": tokens,
            "bytes_per_token": snapshot.kv_bytes_per_token, "bytes": total,
            "replicas": replicas, "bytes_per_replica": total // replicas}


def _replica_count(snapshot) -> int:
    return max(1, len(getattr(snapshot, "replicas", ())))


def _pools(snapshot, admin: bool) -> dict | None:
    """The main pool (global layers) and the window layers' pool, or None for one pool."""
    w = snapshot.window_pool
    if w is None:
        return None
    B, b = snapshot.block_size, snapshot.blocks
    main = {"layers": "global", "blocks": b.total, "tokens": b.total * B,
            "bytes_per_token": w["main_bytes_per_token"]}
    window = {"layers": list(w["layers"]), "window": w["window"], "blocks": w["blocks"],
              "tokens": w["blocks"] * B, "bytes_per_token": w["bytes_per_token"]}
    counts = ("free", "cached", "in_use", "tombstoned")
    window.update({k: (w[k] if admin else 0) for k in counts})
    return {"main": main, "window": window}


def _blocks(snapshot, admin: bool) -> dict:
    return _blocks_of(snapshot.blocks, admin)


def _blocks_of(b, admin: bool) -> dict:
    if not admin:
        return {"total": b.total, "free": 0, "cached": 0, "pinned": 0, "in_use": 0}
    return {"total": b.total, "free": b.free, "cached": b.cached, "pinned": b.pinned,
            "in_use": b.in_use}


def _tree(snapshot, tenant: str | None) -> dict:
    if tenant is None:
        t = snapshot.tree
        return {"nodes": t.nodes, "cached_tokens": t.cached_tokens,
                "evictable_tokens": t.evictable_tokens, "pinned_tokens": t.pinned_tokens,
                "namespaces": t.namespaces}
    counts = snapshot.tenants.get(tenant)
    return {"nodes": 0, "cached_tokens": 0, "evictable_tokens": 0,
            "pinned_tokens": counts.pinned_tokens if counts else 0, "namespaces": 0}


def _tenants(snapshot, book: UsageBook, tenant: str | None) -> dict:
    names = set(book.tenants) | set(snapshot.tenants)
    if tenant is not None:
        names = {tenant}
    out = {}
    for name in sorted(names):
        usage = book.totals(name)
        counts = snapshot.tenants.get(name)
        out[name] = {"tokens": usage.tokens(), "hit_rate": round(usage.hit_rate, 6),
                     "pinned_tokens": counts.pinned_tokens if counts else 0,
                     "running": counts.running if counts else 0,
                     "waiting": counts.waiting if counts else 0,
                     "history": book.history(name)}
    return out


def _prefixes(snapshot, tenant: str | None, decode, headers) -> list[dict]:
    """The admin gets the server-wide list; a tenant the list computed from its own
    namespaces (never a filter of the server-wide one, whose length and gaps would tell it
    about the others' traffic). A prefix that starts with the chat template's opening and
    holds less than a block beyond it is left out: every conversation shares
    ``<|im_start|>system\\n``, which says nothing about what the cache is good for."""
    out = []
    entries = snapshot.top_prefixes if tenant is None else snapshot.tenant_prefixes.get(tenant, ())
    for entry in entries:
        if tenant is not None and entry.tenant != tenant:
            continue
        header = _header_length(entry.token_ids, headers)
        if header and entry.length < header + snapshot.block_size:
            continue
        item = {"tenant": entry.tenant, "tokens": entry.length, "hits": entry.hits,
                "pin_ttl_s": round(entry.pin_ttl_s, 1)}
        if decode is not None:
            text = decode(list(entry.token_ids[:PREVIEW_TOKENS]))
            item["preview"] = text[:PREVIEW_CHARS]
        out.append(item)
    return out


def _header_length(tokens: Sequence[int], headers: Sequence[Sequence[int]]) -> int:
    """The longest of ``headers`` that ``tokens`` start with (0: none)."""
    return max((len(h) for h in headers if tuple(tokens[:len(h)]) == tuple(h)), default=0)


@functools.lru_cache(maxsize=8)
def template_headers(tokenizer) -> tuple[tuple[int, ...], ...]:
    """What the chat template renders before the client's first text: for a conversation
    that opens with a system message (``<|im_start|>system\\n``) and for one that opens with
    a user message (a template may put a default system prompt there). Measured by
    rendering two empty pieces: the first segment is then the template's text alone."""
    empty = (Piece(""), Piece(""))
    shapes = (Conversation(system=empty, messages=(ChatMessage("user", (Piece("."),)),)),
              Conversation(messages=(ChatMessage("user", empty),)))
    out = []
    for conversation in shapes:
        try:
            rendered = render_prompt(tokenizer, conversation)
        except TemplateError:        # e.g. a template without a system role
            continue
        out.append(tuple(rendered.tokens[:rendered.segment_ends[0]]))
    return tuple(out)
