"""Structured output on the real model (SmolLM2-135M), one short test per API through its
official SDK: the grammar makes even this small model's answers valid."""
from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest

from tests.support.engine import integrity
from tests.support.inproc import engine_of, in_process_gateway
from tests.support.server import tenant_key

pytestmark = pytest.mark.realmodel

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"enum": ["celsius", "fahrenheit"]}}}


@pytest.fixture
async def gateway(real_model):
    async with in_process_gateway(tenants=("acme",), kv_cache_gb=0.02, max_model_len=1024,
                                  model=real_model) as (base_url, app):
        yield base_url
        integrity(engine_of(app))


async def test_openai_json_schema_on_the_real_model(gateway):
    client = openai.AsyncOpenAI(base_url=gateway + "/v1", api_key=tenant_key("acme"),
                                max_retries=0, timeout=300)
    done = await client.chat.completions.create(
        model="gpt-4o-mini", max_tokens=40, temperature=0.7, seed=1,
        messages=[{"role": "user", "content": "Describe Ada Lovelace as JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    jsonschema.validate(json.loads(done.choices[0].message.content), PERSON)


async def test_anthropic_forced_tool_on_the_real_model(gateway):
    client = anthropic.AsyncAnthropic(base_url=gateway, api_key=tenant_key("acme"),
                                      max_retries=0, timeout=300)
    done = await client.messages.create(
        model="claude-3-5-haiku-latest", max_tokens=40, extra_body={"temperature": 0.0},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[{"name": "get_weather", "description": "Weather in a city.",
                "input_schema": WEATHER}],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    (use,) = [b for b in done.content if b.type == "tool_use"]
    jsonschema.validate(use.input, WEATHER)
    assert done.stop_reason == "tool_use"


async def test_responses_text_format_on_the_real_model(gateway):
    client = openai.AsyncOpenAI(base_url=gateway + "/v1", api_key=tenant_key("acme"),
                                max_retries=0, timeout=300)
    done = await client.responses.create(
        model="gpt-4o-mini", max_output_tokens=40, temperature=0.0,
        input="Describe Alan Turing as JSON.",
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}})
    jsonschema.validate(json.loads(done.output_text), PERSON)
