"""OpenAI's ``prompt_cache_retention`` on chat completions and completions (it was honoured on
/v1/responses only): ``"24h"`` pins the prompt in the caller's namespace, the usage counts
what it pinned, and with a disk tier the pin outlives the server."""
from __future__ import annotations

import openai
import pytest

from tests.support.inproc import engine_of, in_process_gateway
from tests.support.server import tenant_key

SYSTEM = "You keep the radix tree of every prompt and its paged KV blocks. " * 6
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi?"}]


def client(base_url: str, tenant: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=tenant_key(tenant),
                              max_retries=0, timeout=120)


async def chat(base_url: str, tenant: str, retention: str | None = None, user: str = "Hi?"):
    extra = {} if retention is None else {"prompt_cache_retention": retention}
    return await client(base_url, tenant).chat.completions.create(
        model="gpt-4o-mini", max_tokens=2, temperature=0.0, extra_body=extra,
        messages=[MESSAGES[0], {"role": "user", "content": user}])


def pinned_tokens(app) -> int:
    return engine_of(app).request_snapshot().result(timeout=30).tree.pinned_tokens


async def test_24h_retention_pins_the_prompt_for_its_tenant_only():
    async with in_process_gateway(tenants=("acme", "beta")) as (base_url, app):
        plain = await chat(base_url, "acme", user="first")
        assert plain.usage.prompt_tokens_details.model_extra.get("cache_creation_tokens") is None
        assert pinned_tokens(app) == 0 and getattr(plain, "prompt_cache_retention", None) is None
        kept = await chat(base_url, "acme", "24h")
        created = kept.usage.prompt_tokens_details.model_extra["cache_creation_tokens"]
        assert created > 0 and kept.prompt_cache_retention == "24h"
        assert pinned_tokens(app) >= kept.usage.prompt_tokens - 1
        again = await chat(base_url, "acme", user="another question")
        assert again.usage.prompt_tokens_details.cached_tokens >= len(SYSTEM) // 8
        other = await chat(base_url, "beta", "24h")               # its own namespace
        assert other.usage.prompt_tokens_details.cached_tokens == 0
        memory = await chat(base_url, "beta", "in_memory", user="x")
        assert memory.usage.prompt_tokens_details.model_extra.get("cache_creation_tokens") is None


async def test_completions_honour_it_and_an_unknown_value_is_a_400():
    async with in_process_gateway(tenants=("acme",)) as (base_url, app):
        acme = client(base_url, "acme")
        done = await acme.completions.create(model="gpt-4o-mini", prompt=SYSTEM, max_tokens=1,
                                             temperature=0.0,
                                             extra_body={"prompt_cache_retention": "24h"})
        assert done.usage.prompt_tokens_details.model_extra["cache_creation_tokens"] > 0
        assert pinned_tokens(app) > 0
        with pytest.raises(openai.BadRequestError) as refused:
            await acme.chat.completions.create(
                model="gpt-4o-mini", max_tokens=1, messages=MESSAGES,
                extra_body={"prompt_cache_retention": "forever"})
        assert "prompt_cache_retention" in str(refused.value)


async def test_24h_retention_outlives_a_restart_with_the_disk_tier(tmp_path):
    """The pin is written to the tier when it is made (an hour or more), with its day-long
    retention: a new server on the same folder reads the prompt from disk."""
    cache = {"disk": {"dir": str(tmp_path / "kv"), "gb": 0.05}}
    async with in_process_gateway(tenants=("acme",), cache=cache) as (base_url, app):
        first = await chat(base_url, "acme", "24h")
        assert first.usage.prompt_tokens_details.model_extra["cache_creation_tokens"] > 0
    async with in_process_gateway(tenants=("acme",), cache=cache) as (base_url, app):
        again = await chat(base_url, "acme", user="after the restart")
        tier = engine_of(app).request_snapshot().result(timeout=30).tier
        assert again.usage.prompt_tokens_details.cached_tokens >= len(SYSTEM) // 8
        assert tier.hit_tokens >= again.usage.prompt_tokens_details.cached_tokens - 16
