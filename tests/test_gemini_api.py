"""Google's Gemini API through the official google-genai SDK over loopback: generate, stream,
count tokens, explicit caches (create, generate with, list, patch, delete), function calls
and response schemas; Gemini's auth headers and error envelope; tenants never see each
other's caches; handles and their K/V outlive a restart with a state folder and a disk tier."""
from __future__ import annotations

import json
import os
import stat

import aiohttp
import jsonschema
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from tests.support.inproc import engine_of, in_process_gateway
from tests.support.server import tenant_key

MODEL = "gemini-2.5-flash"
SYSTEM = "You answer questions about radix trees, paged KV blocks and prefix caching. " * 10
DOCUMENT = "Here is the design document: " + "blocks are refcounted and shared. " * 12
GREEDY = dict(temperature=0.0, max_output_tokens=4)


def client(base_url: str, tenant: str) -> genai.Client:
    return genai.Client(api_key=tenant_key(tenant), http_options=types.HttpOptions(
        base_url=base_url, api_version="v1beta", retry_options=types.HttpRetryOptions(
            attempts=1)))


async def make_cache(gemini: genai.Client, ttl: str = "600s") -> types.CachedContent:
    return await gemini.aio.caches.create(model=MODEL, config=types.CreateCachedContentConfig(
        system_instruction=SYSTEM, contents=[DOCUMENT], ttl=ttl, display_name="design"))


async def ask(gemini: genai.Client, question: str, cache: str | None = None, **config):
    return await gemini.aio.models.generate_content(
        model=MODEL, contents=question,
        config=types.GenerateContentConfig(**GREEDY, cached_content=cache, **config))


async def test_the_sdk_flow_create_generate_list_patch_delete():
    async with in_process_gateway(tenants=("acme",)) as (base_url, app):
        gemini = client(base_url, "acme")
        cache = await make_cache(gemini)
        assert cache.name.startswith("cachedContents/") and cache.display_name == "design"
        assert cache.usage_metadata.total_token_count > 200 and cache.model == f"models/{MODEL}"
        pinned = engine_of(app).request_snapshot().result(timeout=30).tree.pinned_tokens
        assert pinned >= cache.usage_metadata.total_token_count
        answer = await ask(gemini, "Summarize it.", cache.name)
        usage = answer.usage_metadata
        assert usage.cached_content_token_count >= cache.usage_metadata.total_token_count
        assert usage.prompt_token_count > usage.cached_content_token_count
        assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
        assert answer.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
        others = [await make_cache(gemini, "300s") for _ in range(2)]
        pager = await gemini.aio.caches.list(config=types.ListCachedContentsConfig(page_size=2))
        names = [c.name async for c in pager]                  # two pages, followed
        assert names == [cache.name] + [c.name for c in others]
        moved = await gemini.aio.caches.update(name=cache.name,
                                               config=types.UpdateCachedContentConfig(ttl="3600s"))
        assert (moved.expire_time - cache.expire_time).total_seconds() > 2900
        assert (await gemini.aio.caches.get(name=cache.name)).expire_time == moved.expire_time
        await gemini.aio.caches.delete(name=cache.name)
        with pytest.raises(genai_errors.ClientError) as gone:
            await ask(gemini, "Again?", cache.name)
        assert gone.value.code == 404 and gone.value.status == "NOT_FOUND"
        count = await gemini.aio.models.count_tokens(model=MODEL, contents="Hello there")
        assert 0 < count.total_tokens < 40


async def test_another_tenant_can_neither_see_nor_use_a_cache():
    async with in_process_gateway(tenants=("acme", "beta")) as (base_url, app):
        acme, beta = client(base_url, "acme"), client(base_url, "beta")
        cache = await make_cache(acme)
        assert [c.name async for c in await beta.aio.caches.list()] == []
        for attempt in (beta.aio.caches.get(name=cache.name),
                        beta.aio.caches.delete(name=cache.name),
                        beta.aio.caches.update(name=cache.name,
                                               config=types.UpdateCachedContentConfig(ttl="9s")),
                        ask(beta, "Summarize it.", cache.name)):
            with pytest.raises(genai_errors.ClientError) as refused:
                await attempt
            assert refused.value.code == 404
        same_text = await beta.aio.models.generate_content(
            model=MODEL, contents=[DOCUMENT, "Summarize it."],
            config=types.GenerateContentConfig(system_instruction=SYSTEM, **GREEDY))
        assert not same_text.usage_metadata.cached_content_token_count     # its own namespace
        assert (await acme.aio.caches.get(name=cache.name)).name == cache.name


async def test_stream_function_calls_and_response_schemas():
    async with in_process_gateway(tenants=("acme",)) as (base_url, app):
        gemini = client(base_url, "acme")
        chunks = [c async for c in await gemini.aio.models.generate_content_stream(
            model=MODEL, contents="Hi", config=types.GenerateContentConfig(**GREEDY))]
        assert chunks[-1].usage_metadata.candidates_token_count == 4
        assert chunks[-1].candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
        weather = types.FunctionDeclaration(
            name="get_weather", description="The weather in a city",
            parameters={"type": "OBJECT", "required": ["city"], "properties": {
                "city": {"type": "STRING", "enum": ["Oslo", "Paris"]}}})
        called = await gemini.aio.models.generate_content(
            model=MODEL, contents="What is the weather in Oslo?",
            config=types.GenerateContentConfig(
                temperature=0.0, max_output_tokens=40,
                tools=[types.Tool(function_declarations=[weather])],
                tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
                    mode="ANY", allowed_function_names=["get_weather"]))))
        call = called.function_calls[0]
        assert call.name == "get_weather" and call.args["city"] in ("Oslo", "Paris")
        assert "x-radixgate-ignored-fields" not in called.sdk_http_response.headers
        schema = {"type": "OBJECT", "properties": {
            "city": {"type": "STRING", "enum": ["Oslo", "Paris"]},
            "degrees": {"type": "INTEGER", "minimum": -50, "maximum": 50}},
            "required": ["city", "degrees"]}
        shaped = await gemini.aio.models.generate_content(
            model=MODEL, contents="Report the weather as JSON.",
            config=types.GenerateContentConfig(temperature=0.0, max_output_tokens=40,
                                               response_mime_type="application/json",
                                               response_schema=schema))
        jsonschema.validate(json.loads(shaped.text), {
            "type": "object", "required": ["city", "degrees"],
            "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}}})


async def test_gemini_auth_and_errors_in_its_envelope():
    async with in_process_gateway(tenants=("acme",)) as (base_url, app):
        url = f"{base_url}/v1beta/models/{MODEL}:generateContent"
        body = {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
                "generationConfig": {"maxOutputTokens": 2, "temperature": 0}}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=body) as missing:
                assert missing.status == 401
                assert (await missing.json())["error"]["status"] == "UNAUTHENTICATED"
            async with http.post(url, params={"key": tenant_key("acme")}, json=body) as keyed:
                assert keyed.status == 200                      # ?key= as Gemini accepts
            headers = {"x-goog-api-key": tenant_key("acme")}
            bad = dict(body, generationConfig={"maxOutputTokens": 2, "responseModalities": ["X"]})
            async with http.post(url, headers=headers, json=bad) as refused:
                error = (await refused.json())["error"]
                assert refused.status == 400 and error["status"] == "INVALID_ARGUMENT"
                assert error["code"] == 400 and "responseModalities" in error["message"]
            async with http.post(f"{base_url}/v1beta/models/other:generateContent",
                                 headers=headers, json=body) as unknown:
                assert unknown.status == 404
                assert (await unknown.json())["error"]["status"] == "NOT_FOUND"
            small = {"model": f"models/{MODEL}", "ttl": "60s",
                     "contents": [{"role": "user", "parts": [{"text": "too short"}]}]}
            async with http.post(f"{base_url}/v1beta/cachedContents", headers=headers,
                                 json=small) as tiny:
                assert tiny.status == 400 and "too small" in (await tiny.json())["error"]["message"]
            image = {"contents": [{"role": "user", "parts": [{"inlineData": {"data": "AA=="}}]}]}
            async with http.post(url, headers=headers, json=image) as unreadable:
                assert unreadable.status == 400


async def test_a_cache_outlives_a_restart_with_its_state_folder_and_the_tier(tmp_path):
    cache_config = {"disk": {"dir": str(tmp_path / "kv"), "gb": 0.05}}
    async with in_process_gateway(tenants=("acme",), cache=cache_config) as (base_url, app):
        cache = await make_cache(client(base_url, "acme"), "7200s")
    state = tmp_path / "radixgate-state"
    saved = state / "gemini" / "caches.json"
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(saved).st_mode) == 0o600
    async with in_process_gateway(tenants=("acme",), cache=cache_config) as (base_url, app):
        gemini = client(base_url, "acme")
        assert (await gemini.aio.caches.get(name=cache.name)).expire_time == cache.expire_time
        answer = await ask(gemini, "Summarize it.", cache.name)
        tier = engine_of(app).request_snapshot().result(timeout=30).tier
        read = answer.usage_metadata.cached_content_token_count
        assert read >= cache.usage_metadata.total_token_count - 16 and tier.hit_tokens >= read - 16


async def test_anthropic_and_openai_requests_name_the_same_cache():
    import anthropic
    import openai
    async with in_process_gateway(tenants=("acme", "beta")) as (base_url, app):
        cache = await make_cache(client(base_url, "acme"))
        size = cache.usage_metadata.total_token_count

        def claude(tenant):
            return anthropic.AsyncAnthropic(base_url=base_url, api_key=tenant_key(tenant),
                                            max_retries=0)
        read = await claude("acme").messages.create(
            model="claude-test", max_tokens=2, messages=[{"role": "user", "content": "Why?"}],
            extra_body={"cached_content": cache.name, "temperature": 0.0})
        assert read.usage.cache_read_input_tokens >= size
        gpt = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=tenant_key("acme"),
                                 max_retries=0)
        chat = await gpt.chat.completions.create(
            model="gpt-4o-mini", max_tokens=2, temperature=0.0,
            messages=[{"role": "user", "content": "How?"}],
            extra_body={"cached_content": cache.name})
        assert chat.usage.prompt_tokens_details.cached_tokens >= size
        with pytest.raises(anthropic.NotFoundError):              # another tenant's cache
            await claude("beta").messages.create(
                model="claude-test", max_tokens=2, messages=[{"role": "user", "content": "?"}],
                extra_body={"cached_content": cache.name})
        with pytest.raises(openai.BadRequestError):               # the cache brings the system
            await gpt.chat.completions.create(
                model="gpt-4o-mini", max_tokens=2, extra_body={"cached_content": cache.name},
                messages=[{"role": "system", "content": "Mine."},
                          {"role": "user", "content": "How?"}])
