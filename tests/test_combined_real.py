"""The capabilities together, as a user runs them: one server process with the default
model at its real KV size (SmolLM2-135M, 46 KiB a token) and the disk tier on, two tenants
over the official SDKs. In one batch a JSON-schema answer, a forced tool call and a free
answer; a prefix evicted to disk and read back (never by the other tenant); a ``kill -9``
and a restart that keeps a 1h-pinned prefix."""
from __future__ import annotations

import asyncio
import json
import time

import anthropic
import httpx2 as httpx   # the HTTP client the anthropic/openai SDKs install
import jsonschema
import openai
import pytest

from tests.support.server import ADMIN_KEY, ServerProcess, ServerSpec, tenant_key

pytestmark = pytest.mark.realmodel

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string", "maxLength": 20}}}
COLORS = ("red", "green", "blue", "amber", "violet", "silver", "orange", "teal")
ANIMALS = ("otter", "heron", "lynx", "gecko", "bison", "raven", "koala", "trout")


def document(seed: int, facts: int) -> str:
    """Distinct text of about 11 tokens a fact."""
    return " ".join(f"Fact {seed}-{i}: the {COLORS[(i + seed) % 8]} {ANIMALS[(i * 3 + seed) % 8]} "
                    f"counts {i * 7 + seed} stones." for i in range(facts))


SYSTEM = "You keep a ledger of animals. " + document(0, 16)      # about 180 tokens, pinned 1h


def spec(disk_dir) -> ServerSpec:
    # 0.0206 GB: ~1,860 tokens of the default int8 KV (11,880 bytes a token)
    return ServerSpec(tiny=False, kv_cache_gb=0.0206, max_model_len=2048, tenants=("acme", "beta"),
                      max_pinned_tokens=4000, request_timeout_s=300,
                      extra_args=("--kv-disk-dir", str(disk_dir), "--kv-disk-gb", "1"))


def openai_client(server, tenant: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=tenant_key(tenant),
                              max_retries=0, timeout=300)


def anthropic_client(server, tenant: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=server.base_url, api_key=tenant_key(tenant),
                                    max_retries=0, timeout=300)


def disk_stats(server) -> dict:
    stats = httpx.get(server.base_url + "/v1/cache/stats", headers={"x-api-key": ADMIN_KEY},
                      timeout=30).json()
    return stats["tiers"]["disk"]


def wait_disk_settled(server, timeout_s: float = 60) -> dict:
    stop, last = time.monotonic() + timeout_s, None
    while time.monotonic() < stop:
        disk = disk_stats(server)
        if disk.get("staged_bytes", 0) == 0 and disk["writes"] == (last or {}).get("writes"):
            return disk
        last = disk
        time.sleep(0.3)
    return disk_stats(server)


async def one_batch(server) -> None:
    """A JSON-schema answer (acme), a forced tool call (beta) and a free answer (acme),
    sent together."""
    schema = openai_client(server, "acme").chat.completions.create(
        model="gpt-4o-mini", max_tokens=40, temperature=0.0,
        messages=[{"role": "user", "content": "Describe Ada Lovelace as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    tool = openai_client(server, "beta").chat.completions.create(
        model="gpt-4o-mini", max_tokens=40, temperature=0.0,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[{"type": "function", "function": {"name": "get_weather",
                                                 "description": "Weather in a city.",
                                                 "parameters": WEATHER}}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    free = anthropic_client(server, "acme").messages.create(
        model="claude-3-5-haiku-latest", max_tokens=12, extra_body={"temperature": 0.0},
        messages=[{"role": "user", "content": "Say hello to the otters."}])
    schema, tool, free = await asyncio.gather(schema, tool, free)
    jsonschema.validate(json.loads(schema.choices[0].message.content), PERSON)
    calls = tool.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)
    assert free.content[0].text and free.usage.output_tokens > 0


async def pinned_request(server):
    return await anthropic_client(server, "acme").messages.create(
        model="claude-3-5-haiku-latest", max_tokens=4, extra_body={"temperature": 0.0},
        system=[{"type": "text", "text": SYSTEM,
                 "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        messages=[{"role": "user", "content": "How many otters?"}])


async def ask(server, tenant: str, text: str) -> int:
    """Cached prompt tokens of a short answer to ``text``."""
    done = await openai_client(server, tenant).chat.completions.create(
        model="gpt-4o-mini", max_tokens=2, temperature=0.0,
        messages=[{"role": "user", "content": text}])
    return done.usage.prompt_tokens_details.cached_tokens or 0


async def test_tier_tenants_and_structured_output_on_the_default_model(tmp_path):
    disk = tmp_path / "kv"
    (tmp_path / "one").mkdir()
    server = ServerProcess(spec(disk), tmp_path / "one").start()
    try:
        await one_batch(server)
        doc = document(1, 60)                                         # about 670 tokens
        assert await ask(server, "acme", doc) < 40                    # the template's head
        for seed in (2, 3):                                           # beta evicts it
            await ask(server, "beta", document(seed, 60))
        before = wait_disk_settled(server)
        assert before["writes"] > 0
        assert await ask(server, "acme", doc) > 600                   # back from disk
        assert disk_stats(server)["hit_tokens"] > before["hit_tokens"]
        assert await ask(server, "beta", doc) < 40                    # never across tenants
        first = await pinned_request(server)      # last: nothing evicts it before the kill
        assert first.usage.cache_creation_input_tokens > 150         # the pin was taken
        wait_disk_settled(server)
    finally:
        server.kill()                                                 # kill -9: no persist
    (tmp_path / "two").mkdir()
    restarted = ServerProcess(spec(disk), tmp_path / "two").start()
    try:
        again = await pinned_request(restarted)
        assert again.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens
        await one_batch(restarted)
    finally:
        assert restarted.stop() == 0
