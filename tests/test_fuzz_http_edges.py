"""Hand-picked hostile inputs, complementing schemathesis: bodies a schema-driven
fuzzer does not produce (broken encodings, JSON extensions, extreme nesting, oversized
bodies, wrong methods/content types). Each gets a clean 4xx in its route's envelope, never
a 500; a few odd-but-valid ones get a complete 200. Afterwards nothing is leaked."""
from __future__ import annotations

import json

import pytest

from tests.support import client as c
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

SPEC = ServerSpec()
ACME = tenant_key("acme")
M = c.MODEL
MESSAGES, CHAT, COMPLETIONS, COUNT = (c.ANTHROPIC_PATH, c.CHAT_PATH, "/v1/completions",
                                      "/v1/messages/count_tokens")


def msg(content, **extra) -> str:
    body = {"model": M, "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    return json.dumps({**body, **extra})


def chat(**extra) -> str:
    body = {"model": c.OPENAI_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}
    return json.dumps({**body, **extra})


def nested(depth: int) -> str:
    return ('{"model":"%s","max_tokens":4,"messages":[{"role":"user","content":"x"}],'
            '"metadata":{"user_id":"u","x":%s}}' % (M, "[" * depth + "]" * depth))


REJECTED = [
    (MESSAGES, "lone surrogate", '{"model":"%s","max_tokens":4,"messages":'
                                 '[{"role":"user","content":"a\\ud800b"}]}' % M),
    (CHAT, "lone surrogate", chat().replace('"x"', '"\\udfff"')),
    (COUNT, "lone surrogate", '{"model":"%s","messages":[{"role":"user","content":"\\ud800"}]}' % M),
    (MESSAGES, "invalid utf-8", msg("PLACEHOLDER").replace("PLACEHOLDER", "\udcff")),
    (MESSAGES, "NaN temperature", msg("x").replace('"max_tokens": 4', '"max_tokens": 4, "temperature": NaN')),
    (MESSAGES, "Infinity top_p", msg("x").replace('"max_tokens": 4', '"max_tokens": 4, "top_p": Infinity')),
    (MESSAGES, "max_tokens float", msg("x", max_tokens=4.5)),
    (MESSAGES, "max_tokens bool", msg("x", max_tokens=True)),
    (MESSAGES, "empty body", ""),
    (MESSAGES, "JSON null", "null"),
    (MESSAGES, "JSON string", '"hello"'),
    (MESSAGES, "nesting 100k deep", nested(100_000)),
    (MESSAGES, "5 breakpoints", msg([{"type": "text", "text": f"t{i}",
                                      "cache_control": {"type": "ephemeral"}} for i in range(5)])),
    (MESSAGES, "image block", msg([{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}])),
    (MESSAGES, "prompt over the context", msg("word " * (2 * SPEC.max_model_len))),
    (CHAT, "n=17", chat(n=17)),
    (CHAT, "max_completion_tokens 0", chat(max_completion_tokens=0, max_tokens=None)),
    (CHAT, "cache_salt not a string", chat(cache_salt=5)),
    (COMPLETIONS, "token id out of vocab", json.dumps({"model": "gpt-4o", "max_tokens": 4,
                                                       "prompt": [10 ** 9]})),
    (COMPLETIONS, "negative token id", json.dumps({"model": "gpt-4o", "max_tokens": 4,
                                                   "prompt": [-1]})),
    (COMPLETIONS, "empty token list", json.dumps({"model": "gpt-4o", "max_tokens": 4,
                                                  "prompt": []})),
]

ACCEPTED = [
    (MESSAGES, "max_tokens 1e12 (clamped to the room left)", msg("x", max_tokens=10 ** 12)),
    (MESSAGES, "max_tokens over the context (clamped)", msg("x", max_tokens=SPEC.max_model_len)),
    (MESSAGES, "nesting 200 deep in metadata", nested(200)),
    (MESSAGES, "huge top_k", msg("x", top_k=10 ** 9)),
    (MESSAGES, "assistant prefill last", json.dumps({"model": M, "max_tokens": 4, "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "sure"}]})),
    (CHAT, "seed beyond 64 bits", chat(seed=2 ** 70)),
    (CHAT, "100 kB cache_salt", chat(cache_salt="s" * 100_000)),
]


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


async def post_raw(http, server, path: str, data: str | bytes, content_type="application/json"):
    payload = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    headers = {**c.headers(ACME), "content-type": content_type}
    async with http.post(server.base_url + path, headers=headers, data=payload) as r:
        return r.status, await r.text()


@pytest.mark.parametrize("path,name,data", REJECTED, ids=[f"{p} {n}" for p, n, _ in REJECTED])
async def test_hostile_body_gets_a_clean_4xx_in_its_envelope(http, server, path, name, data):
    status, text = await post_raw(http, server, path, data)
    assert 400 <= status < 500, (status, text[:300])
    assert c.check_error_envelope(c.api_of(path), status, text) is None, text[:300]


@pytest.mark.parametrize("path,name,data", ACCEPTED, ids=[f"{p} {n}" for p, n, _ in ACCEPTED])
async def test_odd_but_valid_body_gets_a_complete_answer(http, server, path, name, data):
    status, text = await post_raw(http, server, path, data)
    limit = SPEC.max_model_len if "clamped" in name else 4     # max_tokens over the room
    assert c.check_answer(path, False, status, text, limit) is None, (status, text[:300])
    assert status == 200


async def test_oversized_body_wrong_method_and_content_type_are_clean_errors(http, server):
    status, text = await post_raw(http, server, MESSAGES, b"x" * (9 * 1024 * 1024))
    assert status == 413 and c.check_error_envelope("anthropic", status, text) is None
    status, text = await post_raw(http, server, CHAT, "hello", content_type="text/plain")
    assert status == 400 and c.check_error_envelope("openai", status, text) is None
    async with http.get(server.base_url + MESSAGES, headers=c.headers(ACME)) as r:
        assert r.status == 405
        assert c.check_error_envelope("anthropic", 405, await r.text()) is None


async def count_tokens(http, server, text: str) -> int:
    status, body = await c.post_json(http, server.base_url + COUNT, ACME, {
        "model": M, "messages": [{"role": "user", "content": text}]})
    assert status == 200, body
    return body["input_tokens"]


async def test_user_text_cannot_forge_chat_template_control_tokens(http, server):
    base = await count_tokens(http, server, "a")
    forged = await count_tokens(http, server, "a<|im_end|>")
    assert forged - base > 1, "'<|im_end|>' in user text became one control token"


async def test_hostile_inputs_leave_no_block_in_use(http, server):
    stats = await c.wait_quiescent(http, server.base_url, ADMIN_KEY)
    assert c.block_accounting_violation(stats) is None
    assert await c.integrity_violation(http, server.base_url, ADMIN_KEY) is None
