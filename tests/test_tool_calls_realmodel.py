"""Forced tool calls on the default model (SmolLM2-135M) as the issue met them: a named
``tool_choice`` and a plain ``{"name", "country"}`` schema (no ``additionalProperties``) at
the default temperature. Before the fix 2 of these 40 answers were the model's raw
``<tool_call>`` markup as text, cut by ``max_tokens`` while it invented properties; each is
now exactly one call with valid arguments."""
from __future__ import annotations

import asyncio
import json

import anthropic
import jsonschema
import openai
import pytest

from tests.support.engine import integrity
from tests.support.inproc import engine_of, in_process_gateway
from tests.support.server import tenant_key

pytestmark = pytest.mark.realmodel

PLACE = {"type": "object", "properties": {"name": {"type": "string"},
                                          "country": {"type": "string"}},
         "required": ["name", "country"]}
PROMPT = "Lyon is a city in France. Record it."
TOOL = {"name": "record_city", "description": "Record a city and its country."}
REQUESTS = 40
MAX_TOKENS = 64          # the answers here take 18-29 tokens


@pytest.fixture
async def gateway(real_model):
    async with in_process_gateway(tenants=("acme",), kv_cache_gb=0.05, max_model_len=1024,
                                  model=real_model) as (base_url, app):
        yield base_url
        integrity(engine_of(app))


async def test_forty_named_calls_at_the_default_temperature_are_each_one_valid_call(gateway):
    """Identical requests but for their seeds (so the samples are reproducible), sent
    together as one batch."""
    client = openai.AsyncOpenAI(base_url=gateway + "/v1", api_key=tenant_key("acme"),
                                max_retries=0, timeout=600)

    async def one(seed: int):
        return await client.chat.completions.create(
            model="gpt-4o-mini", max_tokens=MAX_TOKENS, seed=seed,
            messages=[{"role": "user", "content": PROMPT}],
            tools=[{"type": "function", "function": {**TOOL, "parameters": PLACE}}],
            tool_choice={"type": "function", "function": {"name": TOOL["name"]}})

    for done in await asyncio.gather(*[one(seed) for seed in range(REQUESTS)]):
        choice = done.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.function.name == TOOL["name"]
        jsonschema.validate(json.loads(call.function.arguments),
                            {**PLACE, "additionalProperties": False})


async def test_a_named_anthropic_tool_is_one_valid_tool_use(gateway):
    client = anthropic.AsyncAnthropic(base_url=gateway, api_key=tenant_key("acme"),
                                      max_retries=0, timeout=600)
    async with client.messages.stream(
            model="claude-3-5-haiku-latest", max_tokens=MAX_TOKENS,
            extra_body={"temperature": 0.0},
            messages=[{"role": "user", "content": PROMPT}],
            tools=[{**TOOL, "input_schema": PLACE}],
            tool_choice={"type": "tool", "name": TOOL["name"],
                         "disable_parallel_tool_use": True}) as stream:
        done = await stream.get_final_message()
    assert done.stop_reason == "tool_use"
    (use,) = done.content
    assert use.type == "tool_use" and use.name == TOOL["name"]
    jsonschema.validate(use.input, {**PLACE, "additionalProperties": False})
