"""HTTP helpers for the reliability suite: request bodies, SSE parsing, envelope checks.

Every checker returns ``None`` when the response is a complete answer or a clean error in
the route's own envelope, else a short string describing the violation; the soak and fault
tests collect those strings and assert there are none.
"""
from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import aiohttp

MODEL = "claude-3-5-haiku-latest"       # matched by the "claude-*" alias
OPENAI_MODEL = "gpt-4o-mini"             # matched by the "gpt-*" alias
ANTHROPIC_PATH = "/v1/messages"
CHAT_PATH = "/v1/chat/completions"

# 5xx a route may answer by design (overloaded); anything else >= 500 is a bug.
OVERLOADED_STATUS = {"anthropic": 529, "openai": 503, "gemini": 503}
CLEAN_4XX = {400, 401, 403, 404, 405, 408, 413, 415, 422, 429}
ANTHROPIC_STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}
OPENAI_FINISH_REASONS = {"stop", "length", "tool_calls"}

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee "
         "zulu cache block radix tree prefix token tenant stream budget").split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def headers(key: str | None) -> dict[str, str]:
    h = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    if key is not None:
        h["x-api-key"] = key
    return h


def anthropic_body(prompt: str, *, system: str | list | None = None, max_tokens: int = 8,
                   stream: bool = False, **extra: Any) -> dict:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "stream": stream,
                            "temperature": 0, "messages": [{"role": "user", "content": prompt}]}
    if system is not None:
        body["system"] = system
    body.update(extra)
    return body


def chat_body(prompt: str, *, system: str | None = None, max_tokens: int = 8,
              stream: bool = False, **extra: Any) -> dict:
    messages = ([{"role": "system", "content": system}] if system else [])
    messages.append({"role": "user", "content": prompt})
    body: dict[str, Any] = {"model": OPENAI_MODEL, "max_tokens": max_tokens, "stream": stream,
                            "temperature": 0, "messages": messages}
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


def api_of(path: str) -> str:
    if path.startswith("/v1beta/"):
        return "gemini"
    return "anthropic" if path.startswith("/v1/messages") else "openai"


# ---------------------------------------------------------------- error envelopes

def check_error_envelope(api: str, status: int, text: str) -> str | None:
    """Clean error: an allowed status and the route's own JSON envelope."""
    if status >= 500 and status != OVERLOADED_STATUS[api]:
        return f"{api} server error {status}: {text[:200]}"
    if status < 500 and status not in CLEAN_4XX:
        return f"{api} unexpected status {status}: {text[:200]}"
    try:
        body = json.loads(text)
    except ValueError:
        return f"{api} {status} error body is not JSON: {text[:200]!r}"
    if api == "anthropic":
        ok = (isinstance(body, dict) and body.get("type") == "error"
              and isinstance(body.get("error"), dict)
              and isinstance(body["error"].get("type"), str)
              and isinstance(body["error"].get("message"), str))
    elif api == "gemini":
        ok = (isinstance(body, dict) and isinstance(body.get("error"), dict)
              and body["error"].get("code") == status
              and isinstance(body["error"].get("message"), str)
              and isinstance(body["error"].get("status"), str))
    else:
        ok = (isinstance(body, dict) and isinstance(body.get("error"), dict)
              and isinstance(body["error"].get("message"), str))
    if not ok:
        return f"{api} {status} error body not in the {api} envelope: {text[:200]}"
    if status == OVERLOADED_STATUS[api] and api == "anthropic" \
            and body["error"]["type"] != "overloaded_error":
        return f"anthropic 529 with error type {body['error']['type']!r}"
    return None


# ---------------------------------------------------------------- complete answers

def check_anthropic_message(body: Any, max_tokens: int) -> str | None:
    if not isinstance(body, dict) or body.get("type") != "message":
        return f"not a message: {str(body)[:200]}"
    if body.get("stop_reason") not in ANTHROPIC_STOP_REASONS:
        return f"bad stop_reason {body.get('stop_reason')!r}"
    usage = body.get("usage") or {}
    counts = [usage.get(k, 0) for k in ("input_tokens", "output_tokens",
                                        "cache_read_input_tokens", "cache_creation_input_tokens")]
    if not all(isinstance(c, int) and c >= 0 for c in counts):
        return f"bad usage {usage}"
    if usage["output_tokens"] > max_tokens:
        return f"output_tokens {usage['output_tokens']} > max_tokens {max_tokens}"
    if not isinstance(body.get("content"), list):
        return "content is not a list"
    return None


def check_openai_chat(body: Any, max_tokens: int) -> str | None:
    if not isinstance(body, dict) or body.get("object") != "chat.completion":
        return f"not a chat.completion: {str(body)[:200]}"
    choices = body.get("choices") or []
    if len(choices) != 1 or choices[0].get("finish_reason") not in OPENAI_FINISH_REASONS:
        return f"bad choices {str(choices)[:200]}"
    usage = body.get("usage") or {}
    if not isinstance(usage.get("completion_tokens"), int) or \
            usage["completion_tokens"] > max_tokens:
        return f"bad usage {usage}"
    return None


def parse_sse(raw: str) -> list[tuple[str | None, str]]:
    """(event name or None, data) for each SSE event in ``raw``; comments skipped."""
    events = []
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        if name is not None or data:
            events.append((name, "\n".join(data)))
    return events


def check_anthropic_stream(raw: str, max_tokens: int) -> str | None:
    """message_start ... message_stop in order, or a clean ``error`` event at the end."""
    events = parse_sse(raw)
    names = [n for n, _ in events if n != "ping"]
    if not names:
        return "empty stream"
    if names[-1] == "error":
        body = json.loads(dict(events)["error"]) if events else {}
        return None if body.get("type") == "error" else f"bad error event {body}"
    if names[0] != "message_start" or names[-1] != "message_stop":
        return f"stream not framed by message_start/message_stop: {names[:3]}...{names[-3:]}"
    if names.count("content_block_start") != names.count("content_block_stop"):
        return "unbalanced content blocks"
    deltas = [json.loads(d) for n, d in events if n == "message_delta"]
    if len(deltas) != 1 or deltas[0]["delta"].get("stop_reason") not in ANTHROPIC_STOP_REASONS:
        return f"bad message_delta {deltas}"
    if deltas[0].get("usage", {}).get("output_tokens", 0) > max_tokens:
        return "stream output_tokens > max_tokens"
    return None


def check_openai_stream(raw: str, max_tokens: int) -> str | None:
    """chunks then ``data: [DONE]``; a finish_reason on the last choice chunk; or an error."""
    datas = [d for _, d in parse_sse(raw)]
    if not datas:
        return "empty stream"
    if datas[-1] != "[DONE]":
        last = _json_or_none(datas[-1])
        if isinstance(last, dict) and isinstance(last.get("error"), dict):
            return None
        return f"stream did not end with [DONE]: {datas[-1][:200]}"
    chunks = [_json_or_none(d) for d in datas[:-1]]
    if any(not isinstance(c, dict) for c in chunks):
        return "non-JSON chunk"
    if any("error" in c for c in chunks):
        return None
    finishes = [ch.get("finish_reason") for c in chunks for ch in c.get("choices", [])
                if ch.get("finish_reason")]
    if len(finishes) != 1 or finishes[0] not in OPENAI_FINISH_REASONS:
        return f"bad finish reasons {finishes}"
    return None


def stream_ended_in_error(text: str) -> bool:
    """A 200 stream whose last event is an error (Anthropic ``event: error``, OpenAI an
    ``{"error": ...}`` chunk, possibly followed by ``[DONE]``)."""
    events = [e for e in parse_sse(text) if e[1] != "[DONE]"]
    if not events:
        return False
    name, data = events[-1]
    return name == "error" or isinstance(_json_or_none(data), dict) and "error" in _json_or_none(data)


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def check_answer(path: str, stream: bool, status: int, text: str, max_tokens: int
                 ) -> str | None:
    """Dispatch to the right checker for a finished HTTP exchange."""
    api = api_of(path)
    if status != 200:
        return check_error_envelope(api, status, text)
    if stream:
        check = check_anthropic_stream if api == "anthropic" else check_openai_stream
        return check(text, max_tokens)
    body = _json_or_none(text)
    check = check_anthropic_message if api == "anthropic" else check_openai_chat
    return check(body, max_tokens)


# ---------------------------------------------------------------- admin/stat helpers

async def get_json(session: aiohttp.ClientSession, url: str, key: str | None
                   ) -> tuple[int, Any]:
    async with session.get(url, headers=headers(key)) as r:
        text = await r.text()
        return r.status, _json_or_none(text) if text else None


async def post_json(session: aiohttp.ClientSession, url: str, key: str | None, body: Any
                    ) -> tuple[int, Any]:
    async with session.post(url, headers=headers(key), json=body) as r:
        text = await r.text()
        return r.status, _json_or_none(text) if text else text


async def wait_quiescent(session: aiohttp.ClientSession, base: str, admin_key: str,
                         timeout_s: float = 30.0) -> dict:
    """Poll /v1/cache/stats (admin) until nothing runs, waits or holds a block; return it."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    stats: dict = {}
    while True:
        status, stats = await get_json(session, base + "/v1/cache/stats", admin_key)
        assert status == 200, stats
        req, blocks = stats["requests"], stats["blocks"]
        if req["running"] == 0 and req["waiting"] == 0 and blocks["in_use"] == 0:
            return stats
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"server not quiescent after {timeout_s}s: {stats}")
        await asyncio.sleep(0.2)


def block_accounting_violation(stats: dict) -> str | None:
    """in_use 0 and free + cached + pinned == total (states are disjoint, docs/USAGE.md Endpoints)."""
    b = stats["blocks"]
    if b["in_use"] != 0:
        return f"blocks still in use after load: {b}"
    if b["free"] + b["cached"] + b["pinned"] != b["total"]:
        return f"block states do not add up to total: {b}"
    return None


INTEGRITY_PATH = "/v1/admin/integrity"


async def integrity_violation(session: aiohttp.ClientSession, base: str, admin_key: str
                              ) -> str | None:
    """Run the engine's check_integrity() through the admin endpoint; None when clean."""
    status, body = await get_json(session, base + INTEGRITY_PATH, admin_key)
    if status != 200 or not isinstance(body, dict) or body.get("ok") is not True:
        return f"integrity check failed ({status}): {str(body)[:300]}"
    return None


async def flush_tenant(session: aiohttp.ClientSession, base: str, admin_key: str,
                       tenant: str, cache_salt: str | None = None) -> None:
    """Admin flush of one tenant's namespace, so its next request starts from an empty cache."""
    body = {"tenant": tenant} if cache_salt is None else {"tenant": tenant, "cache_salt": cache_salt}
    status, answer = await post_json(session, base + "/v1/cache/flush", admin_key, body)
    assert status == 200, answer


def openai_client(server, tenant: str):
    """The official openai SDK client for ``tenant`` on a test server (no retries)."""
    import openai

    from tests.support.server import tenant_key
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=tenant_key(tenant),
                         max_retries=0, timeout=60)


def unique_text(words: int = 40) -> str:
    """A prompt no other test sends (a fresh nonce in every word)."""
    import uuid
    nonce = uuid.uuid4().hex
    return f"Context {nonce}: " + " ".join(f"entry{i}-{nonce[i % 32]}" for i in range(words))

