"""Rough edges a new user met (issue 47): errors that name the client's own fields, the
too-long error that names the ``max_tokens`` sent, one ``max_tokens`` rule whatever its
JSON spelling, 404s for flushing what does not exist, Anthropic's 400 for a
``tool_result`` without its ``tool_use``, and ``GET /`` pointing somewhere useful."""
from __future__ import annotations

import json
import uuid

import httpx2 as httpx   # the HTTP client the anthropic/openai SDKs install
import pytest

from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

# the tests/test_api_*.py modules' server (same spec: one server for all of them)
SPEC = ServerSpec(tenants=("gw_one", "gw_two", "org_1", "org_12345"), max_pinned_tokens=4096,
                  kv_cache_gb=0.008)
KEY = {"x-api-key": tenant_key("gw_one")}
ADMIN = {"x-api-key": ADMIN_KEY}
MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
# every request here in a namespace of its own: the tools header and prompts it caches, and
# its flushes, must not change what the other modules on this server read from the cache
SALT = "rough-edges-" + uuid.uuid4().hex
PYDANTIC_NAMES = ("tagged-union", "list[", ".str", "literal[", "TextBlock", "TextPart",
                  "NamedToolChoice")


@pytest.fixture(scope="module")
def http(pytestconfig):
    server = shared_server(pytestconfig, SPEC)
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


def anthropic_body(**overrides) -> dict:
    return {"model": "claude-3-haiku", "max_tokens": 4, "cache_salt": SALT,
            "messages": [{"role": "user", "content": "hi"}], **overrides}


def chat_body(**overrides) -> dict:
    return {"model": "gpt-4o", "max_tokens": 4, "cache_salt": SALT,
            "messages": [{"role": "user", "content": "hi"}], **overrides}


def anthropic_error(response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] in (
        "invalid_request_error", "not_found_error")
    return body["error"]["message"]


def openai_error(response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def blocks(*content) -> list[dict]:
    return [{"role": "user", "content": list(content)}]


# -- error messages name the client's fields ------------------------------------------------

@pytest.mark.parametrize("overrides, path", [
    ({"messages": blocks({"type": "text", "text": "hi"}, {"type": "text", "text": 5})},
     "messages.0.content.1.text: Input should be a valid string"),
    ({"messages": blocks({"type": "text"})}, "messages.0.content.0.text: Field required"),
    ({"system": 5}, "system: Input should be a valid string or a valid list"),
    ({"system": [{"type": "text", "text": []}]}, "system.0.text: Input should be a valid string"),
    ({"messages": blocks({"type": "tool_use", "id": "t", "name": "f", "input": 3})},
     "messages.0.content.0.input: Input should be an object"),
])
def test_anthropic_errors_name_the_clients_field_path(http, overrides, path):
    message = anthropic_error(http.post(MESSAGES, json=anthropic_body(**overrides), headers=KEY))
    assert message == path
    assert not any(name in message for name in PYDANTIC_NAMES), message


@pytest.mark.parametrize("overrides, path", [
    ({"messages": blocks({"type": "text", "text": 3})}, "messages.0.content.0.text"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"tool_choice": {"type": "function"}}, "tool_choice.function"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
])
def test_openai_errors_name_the_clients_field_path(http, overrides, path):
    error = openai_error(http.post(CHAT, json=chat_body(**overrides), headers=KEY))
    assert error["param"] == path and error["message"].startswith(path + ": ")
    assert not any(name in error["message"] for name in PYDANTIC_NAMES), error


# -- the too-long error ----------------------------------------------------------------------

TOO_LONG = [{"role": "user", "content": "word " * 600}]


def test_too_long_names_the_max_tokens_sent_and_carries_openais_code(http):
    error = openai_error(http.post(CHAT, json=chat_body(max_tokens=300, messages=TOO_LONG),
                                   headers=KEY))
    assert error["code"] == "context_length_exceeded"
    assert "max_tokens 300" in error["message"] and "context window of 512" in error["message"]
    assert "max_tokens (1)" not in error["message"]
    message = anthropic_error(http.post(MESSAGES, json=anthropic_body(max_tokens=300,
                                                                      messages=TOO_LONG),
                                        headers=KEY))
    assert "max_tokens 300" in message and "max_tokens (1)" not in message


# -- one max_tokens rule ---------------------------------------------------------------------

# a long prompt leaves little room, so a clamped max_tokens generates few tokens
ROOMY = "word " * 440


@pytest.mark.parametrize("spelling", ["1180591620717411303424", "1e12", "1000000000000.0",
                                      "1.0e21"])
def test_a_huge_max_tokens_is_clamped_whatever_its_json_spelling(http, spelling):
    for path, body, answer_tokens in (
            (MESSAGES, anthropic_body(messages=[{"role": "user", "content": ROOMY}]),
             lambda r: r["usage"]["output_tokens"]),
            (CHAT, chat_body(messages=[{"role": "user", "content": ROOMY}]),
             lambda r: r["usage"]["completion_tokens"])):
        raw = json.dumps(body).replace('"max_tokens": 4', f'"max_tokens": {spelling}')
        response = http.post(path, content=raw, headers={**KEY, "content-type":
                                                         "application/json"})
        assert response.status_code == 200, (path, spelling, response.text)
        assert 1 <= answer_tokens(response.json()) <= 512


@pytest.mark.parametrize("spelling", ["1.5", "1e-3", "true", "\"16\""])
def test_a_max_tokens_that_is_not_a_whole_number_is_a_400_on_both_apis(http, spelling):
    for path, body in ((MESSAGES, anthropic_body()), (CHAT, chat_body())):
        raw = json.dumps(body).replace('"max_tokens": 4', f'"max_tokens": {spelling}')
        response = http.post(path, content=raw, headers={**KEY, "content-type":
                                                         "application/json"})
        assert response.status_code == 400, (path, spelling, response.text)
        assert "max_tokens" in response.text


# -- flushes, tool results, GET / ------------------------------------------------------------

def test_flushing_a_tenant_or_salt_that_does_not_exist_is_a_404(http):
    assert "nobody" in openai_error(http.post("/v1/cache/flush", json={"tenant": "nobody"},
                                              headers=ADMIN), 404)["message"]
    salt = "never-" + uuid.uuid4().hex
    error = openai_error(http.post("/v1/cache/flush", json={"tenant": "gw_one", "cache_salt": salt},
                                   headers=ADMIN), 404)
    assert salt in error["message"] and error["param"] == "cache_salt"
    unsalted = {"tenant": "org_12345"}          # a tenant's own namespace: there even if empty
    assert http.post("/v1/cache/flush", json=unsalted, headers=ADMIN).status_code == 200
    used = SALT + "-used"
    assert http.post(MESSAGES, json=anthropic_body(cache_salt=used), headers=KEY).status_code == 200
    flushed = http.post("/v1/cache/flush", json={"tenant": "gw_one", "cache_salt": used},
                        headers=ADMIN)
    assert flushed.status_code == 200 and flushed.json()["freed_blocks"] >= 0
    assert http.post("/v1/cache/flush", json={"cache_salt": used},    # no tenant: not "all"
                     headers=ADMIN).status_code == 400


TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}


def result(tool_use_id: str) -> dict:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": "Sunny"}


def test_a_tool_result_without_its_tool_use_is_anthropics_400(http):
    orphan = [{"role": "user", "content": "Weather?"},
              {"role": "assistant", "content": [CALL]},
              {"role": "user", "content": [result("toolu_2")]}]
    message = anthropic_error(http.post(MESSAGES, json=anthropic_body(tools=[TOOL],
                                                                      messages=orphan),
                                        headers=KEY))
    assert message.startswith("messages.2.content.0: unexpected `tool_use_id`")
    assert "toolu_2" in message
    first = [{"role": "user", "content": [result("toolu_1")]}]
    anthropic_error(http.post(MESSAGES, json=anthropic_body(messages=first), headers=KEY))
    answered = orphan[:2] + [{"role": "user", "content": [result("toolu_1")]}]
    assert http.post(MESSAGES, json=anthropic_body(tools=[TOOL], messages=answered),
                     headers=KEY).status_code == 200


def test_the_root_points_to_the_dashboard_and_the_docs(http):
    links = http.get("/").json()
    assert links["dashboard"] == "/dashboard" and links["openapi"] == "/openapi.json"
    assert "docs/USAGE.md" in links["docs"]
    assert http.get(links["dashboard"]).status_code == 200
    assert http.get(links["openapi"]).status_code == 200
    page = http.get("/", headers={"accept": "text/html,application/xhtml+xml"})
    assert page.headers["content-type"].startswith("text/html")
    assert 'href="/dashboard"' in page.text and 'href="/openapi.json"' in page.text
