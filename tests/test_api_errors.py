"""Bad input over HTTP: each error in its endpoint's envelope and status, never a 500;
request ids on every response (header and body ``id``); 401/403 for keys."""
from __future__ import annotations

import httpx2 as httpx   # the HTTP client the anthropic/openai SDKs install
import pytest

from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

# Own tenants (and so its own server, shared by the tests/test_api_*.py modules): other
# suites' pins and flushes on the default spec's tenants cannot disturb these, nor these them.
# pins are shared out per tenant (ceiling / 5 entries): 8 MB of KV gives each ~1600 tokens
SPEC = ServerSpec(tenants=("gw_one", "gw_two", "org_1", "org_12345"), max_pinned_tokens=4096,
                  kv_cache_gb=0.008)
KEY = {"x-api-key": tenant_key("gw_one")}
MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def anthropic_body(**overrides) -> dict:
    return {"model": "claude-3-haiku", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}], **overrides}


def chat_body(**overrides) -> dict:
    return {"model": "gpt-4o", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}], **overrides}


def assert_anthropic_error(response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == error_type
    assert response.headers["request-id"].startswith("req_")
    return body["error"]["message"]


def assert_openai_error(response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert response.headers["request-id"].startswith("req_")
    return error["message"]


BAD_BODIES = [
    (b"{not json", "not valid JSON"),
    (b'{"model": "claude-3-x", "max_tokens": NaN, "messages": []}', "not valid JSON"),
    (b"[]", "JSON object"),
    (b"", "empty"),
]


@pytest.mark.parametrize("raw, fragment", BAD_BODIES)
def test_malformed_json_is_400_in_both_envelopes(http, raw, fragment):
    headers = {**KEY, "content-type": "application/json"}
    message = assert_anthropic_error(http.post(MESSAGES, content=raw, headers=headers), 400,
                                     "invalid_request_error")
    assert fragment in message
    assert fragment in assert_openai_error(http.post(CHAT, content=raw, headers=headers), 400)


@pytest.mark.parametrize("overrides, fragment", [
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": "hello"}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"temperature": 3}, "temperature"),
    ({"messages": [{"role": "user", "content": "word " * 600}]}, "context window"),
])
def test_wrong_types_and_limits_are_anthropic_400s(http, overrides, fragment):
    response = http.post(MESSAGES, json=anthropic_body(**overrides), headers=KEY)
    assert fragment in assert_anthropic_error(response, 400, "invalid_request_error")


@pytest.mark.parametrize("overrides, status", [
    ({"max_tokens": -1}, 400), ({"n": 17}, 400),
    ({"messages": [{"role": "user", "content": "word " * 600}]}, 400),
    ({"model": "llama-3"}, 404), ({"model": "unknown"}, 404), ({"stream": "yes"}, 400),
    ({"temperature": "0.5"}, 400),
])
def test_chat_errors_use_openai_status_and_envelope(http, overrides, status):
    assert_openai_error(http.post(CHAT, json=chat_body(**overrides), headers=KEY), status)


def test_unknown_model_is_404_in_each_envelope(http):
    # aliases (claude-*, gpt-*) hold for both APIs; other names are unknown
    response = http.post(MESSAGES, json=anthropic_body(model="mistral-large"), headers=KEY)
    assert "mistral-large" in assert_anthropic_error(response, 404, "not_found_error")
    response = http.post("/v1/completions", json={"model": "llama-3", "prompt": "a"}, headers=KEY)
    assert_openai_error(response, 404)


def test_oversized_body_is_413(http):
    huge = {"model": "claude-3-x", "max_tokens": 1,
            "messages": [{"role": "user", "content": "a" * (9 * 1024 * 1024)}]}
    assert_anthropic_error(http.post(MESSAGES, json=huge, headers=KEY), 413, "request_too_large")
    assert_openai_error(http.post(CHAT, json={**huge, "model": "gpt-4o"}, headers=KEY), 413)


def test_missing_or_unknown_key_is_401_and_tenant_key_on_admin_route_is_403(http):
    assert_anthropic_error(http.post(MESSAGES, json=anthropic_body()), 401, "authentication_error")
    assert_anthropic_error(http.post(MESSAGES, json=anthropic_body(),
                                     headers={"x-api-key": "sk-wrong"}), 401, "authentication_error")
    assert_openai_error(http.post(CHAT, json=chat_body(),
                                  headers={"authorization": "Bearer sk-wrong"}), 401)
    assert_openai_error(http.post("/v1/cache/flush", headers=KEY), 403)
    assert_openai_error(http.get("/v1/admin/integrity", headers=KEY), 403)


def test_bearer_key_works_like_x_api_key(http):
    response = http.post(CHAT, json=chat_body(),
                         headers={"authorization": f"Bearer {tenant_key('gw_one')}"})
    assert response.status_code == 200


def test_every_response_has_a_request_id_matching_the_body_id(http):
    ok = http.post(MESSAGES, json=anthropic_body(), headers=KEY)
    assert ok.status_code == 200
    rid = ok.headers["request-id"]
    assert ok.json()["id"] == "msg_" + rid.removeprefix("req_")
    chat = http.post(CHAT, json=chat_body(), headers=KEY)
    assert chat.json()["id"] == "chatcmpl-" + chat.headers["request-id"].removeprefix("req_")
    for response in (http.get("/health"), http.get("/nope"), http.get("/openapi.json"),
                     http.get("/v1/models", headers=KEY)):
        assert response.headers["request-id"].startswith("req_")
    assert len({ok.headers["request-id"], chat.headers["request-id"]}) == 2


def test_method_not_allowed_and_unknown_route_are_clean_errors(http):
    assert_openai_error(http.get(CHAT, headers=KEY), 405)
    assert_openai_error(http.get("/v1/does-not-exist", headers=KEY), 404)


def test_stream_refused_before_200_gets_a_plain_error(http):
    too_long = [{"role": "user", "content": "word " * 600}]
    response = http.post(MESSAGES, json=anthropic_body(stream=True, messages=too_long),
                         headers=KEY)
    assert "context window" in assert_anthropic_error(response, 400, "invalid_request_error")
    response = http.post(CHAT, json=chat_body(stream=True, messages=too_long), headers=KEY)
    assert_openai_error(response, 400)


def test_admin_key_is_accepted_everywhere(http):
    admin = {"x-api-key": ADMIN_KEY}
    assert http.post(MESSAGES, json=anthropic_body(), headers=admin).status_code == 200
    assert http.get("/v1/admin/integrity", headers=admin).json()["ok"] is True


def test_one_access_log_line_per_request_with_tenant_and_tokens(http, server):
    ok = http.post(MESSAGES, json=anthropic_body(), headers=KEY)
    rid = ok.headers["request-id"]
    bad = http.post(CHAT, json=chat_body(n=17), headers=KEY).headers["request-id"]
    log = server.log_path.read_text(errors="replace")
    (line,) = [line for line in log.splitlines() if rid in line]
    assert "POST /v1/messages 200 tenant=gw_one" in line
    usage = ok.json()["usage"]
    prompt = sum(usage[k] for k in ("input_tokens", "cache_read_input_tokens",
                                    "cache_creation_input_tokens"))
    assert f"prompt={prompt} cached={usage['cache_read_input_tokens']} output=" in line
    assert "ttft_ms=" in line and "ttft_ms=-" not in line
    (error_line,) = [line for line in log.splitlines() if bad in line]
    assert "POST /v1/chat/completions 400 tenant=gw_one" in error_line
