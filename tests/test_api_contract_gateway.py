"""The API contract, gateway side, over real HTTP (tiny model, loopback) and the official SDKs:
max_tokens clamped to the context (strict_max_tokens restores the 400), the model's other
names, /tokenize /detokenize /version, x-request-id, CORS, Anthropic version / thinking /
service_tier / ignored fields, vLLM-named metrics."""
from __future__ import annotations

import json
import re

import anthropic
import openai
import pytest

from tests.support import client as c
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

SPEC = ServerSpec(kv_cache_gb=0.004, max_model_len=512, tenants=("acme",),
                  server_settings=(("cors_allow_origins", '["http://app.example"]'),))
STRICT = ServerSpec(kv_cache_gb=0.004, max_model_len=512, tenants=("acme",),
                    server_settings=(("strict_max_tokens", "true"),))
KEY = tenant_key("acme")
HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def gpt(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)


def test_a_claude_style_max_tokens_is_clamped_to_the_room_left(claude, gpt):
    with claude.messages.stream(model="claude-sonnet-4", max_tokens=32_000,
                                messages=[{"role": "user", "content": "hello"}],
                                extra_body={"temperature": 0}) as stream:
        message = stream.get_final_message()
    room = 512 - message.usage.input_tokens - message.usage.cache_read_input_tokens
    assert 1 <= message.usage.output_tokens <= room
    assert message.stop_reason in ("max_tokens", "end_turn")
    chat = gpt.chat.completions.create(model="gpt-4o", max_tokens=100_000, temperature=0,
                                       messages=[{"role": "user", "content": "hello"}])
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens <= 512


def test_strict_max_tokens_restores_the_400(pytestconfig):
    strict = shared_server(pytestconfig, STRICT)
    client = anthropic.Anthropic(base_url=strict.base_url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as info:
        with client.messages.stream(model="claude-sonnet-4", max_tokens=32_000,
                                    messages=[{"role": "user", "content": "hello"}]) as stream:
            stream.get_final_message()
    assert "context window" in str(info.value)


def test_the_model_is_served_under_its_hugging_face_id_and_file_name(gpt, claude):
    for name in (HF_ID, "SmolLM2-135M-Instruct.Q4_1.gguf"):
        chat = gpt.chat.completions.create(model=name, max_tokens=1, temperature=0,
                                           messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].finish_reason in ("length", "stop")
    assert claude.messages.create(model=HF_ID, max_tokens=1,
                                  messages=[{"role": "user", "content": "hi"}]).usage
    with pytest.raises(openai.NotFoundError):
        gpt.chat.completions.create(model="mistral-7b", max_tokens=1,
                                    messages=[{"role": "user", "content": "hi"}])


async def test_an_omitted_openai_model_means_the_served_one(http, server):
    body = {"max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    async with http.post(server.base_url + c.CHAT_PATH, json=body, headers=c.headers(KEY)) as r:
        assert r.status == 200
        assert (await r.json())["model"] == "smollm2-135m-instruct"


async def test_tokenize_and_detokenize_in_vllm_shapes(http, server, gpt):
    base, headers = server.base_url, c.headers(KEY)
    async with http.post(base + "/tokenize", json={"prompt": "hello world"}, headers=headers) as r:
        assert r.status == 200
        out = await r.json()
    assert out["count"] == len(out["tokens"]) > 0 and out["max_model_len"] == 512
    async with http.post(base + "/detokenize", json={"tokens": out["tokens"]},
                         headers=headers) as r:
        assert (await r.json()) == {"prompt": "hello world"}
    messages = [{"role": "user", "content": "count me"}]
    async with http.post(base + "/tokenize", json={"messages": messages}, headers=headers) as r:
        chat_tokens = (await r.json())["count"]
    chat = gpt.chat.completions.create(model="gpt-4o", max_tokens=1, messages=messages)
    assert chat.usage.prompt_tokens == chat_tokens          # rendered as the chat route does
    async with http.post(base + "/tokenize", json={"prompt": "x"}) as r:
        assert r.status == 401
    async with http.post(base + "/detokenize", json={"tokens": [10 ** 9]}, headers=headers) as r:
        assert r.status == 400
    async with http.get(base + "/version") as r:
        assert r.status == 200 and (await r.json())["version"]


async def test_the_clients_x_request_id_is_echoed(http, server):
    headers = {**c.headers(KEY), "x-request-id": "trace-123"}
    async with http.post(server.base_url + c.ANTHROPIC_PATH, headers=headers,
                         json=c.anthropic_body("hi", max_tokens=1)) as r:
        assert r.headers["x-request-id"] == "trace-123"
        assert r.headers["request-id"].startswith("req_")           # ours stays ours
    text = server.log_path.read_text()
    assert "(client trace-123)" in text


async def test_cors_preflight_and_headers_for_allowed_origins_only(http, server):
    url = server.base_url + c.CHAT_PATH
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "content-type, x-api-key"}
    async with http.options(url, headers=preflight) as r:
        assert r.status == 204
        assert r.headers["Access-Control-Allow-Headers"] == "content-type, x-api-key"
        assert "POST" in r.headers["Access-Control-Allow-Methods"]
        assert r.headers["Access-Control-Allow-Origin"] == "http://app.example"
    async with http.options(url, headers={**preflight, "Origin": "http://evil.example"}) as r:
        assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
    body = c.chat_body("hi", max_tokens=1)
    for origin, allowed in (("http://app.example", True), ("http://evil.example", False)):
        async with http.post(url, json=body, headers={**c.headers(KEY), "Origin": origin}) as r:
            assert r.status == 200
            assert ("Access-Control-Allow-Origin" in r.headers) is allowed


async def test_anthropic_version_thinking_service_tier_and_ignored_fields(http, server):
    url = server.base_url + c.ANTHROPIC_PATH
    body = c.anthropic_body("hi", max_tokens=1)
    for version in ("not-a-version", "2019-01-01"):
        async with http.post(url, json=body, headers={**c.headers(KEY),
                                                      "anthropic-version": version}) as r:
            assert r.status == 400 and "anthropic-version" in await r.text()
    async with http.post(url, json={**body, "thinking": {"type": "enabled", "budget_tokens": 1024}},
                         headers=c.headers(KEY)) as r:
        error = (await r.json())["error"]
        assert r.status == 400 and "thinking" in error["message"]
    served = {**body, "thinking": {"type": "disabled"}, "service_tier": "auto",
              "metadata": {"user_id": "u1"}, "frobnicate": 1, "zz_extra": True}
    async with http.post(url, json=served, headers=c.headers(KEY)) as r:
        assert r.status == 200
        assert r.headers["x-radixgate-ignored-fields"] == "frobnicate, zz_extra"


async def test_vllm_named_metrics_carry_the_model_name(http, server, claude):
    claude.messages.create(model="claude-x", max_tokens=2,
                           messages=[{"role": "user", "content": "metrics please"}])
    async with http.get(server.base_url + "/metrics", headers=c.headers(ADMIN_KEY)) as r:
        text = await r.text()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:request_success_total"):
        assert re.search(re.escape(name) + r'\{[^}]*model_name="smollm2-135m-instruct"', text), name
    assert re.search(r'vllm:request_success_total\{[^}]*finished_reason="(length|stop)"', text)
    async with http.get(server.base_url + "/metrics", headers=c.headers(KEY)) as r:
        scoped = await r.text()
    assert 'vllm:prompt_tokens_total{model_name="smollm2-135m-instruct",tenant="acme"}' in scoped
    assert json.dumps("admin") not in scoped
