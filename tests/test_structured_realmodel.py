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


STRICT_WEATHER = {"type": "object", "additionalProperties": False,
                  "required": ["city", "unit", "days"],
                  "properties": {"city": {"type": "string", "maxLength": 20},
                                 "unit": {"enum": ["celsius", "fahrenheit"]},
                                 "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
ONE_SHOT = [{"role": "user", "content": "What is the weather in Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 C"},
            {"role": "assistant", "content": "It is sunny in Rome, 24 C."},
            {"role": "user", "content": "What is the weather in Paris?"}]


def weather_tool(schema: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "get_weather", "strict": True,
                                              "description": "Current weather in a city.",
                                              "parameters": schema}}]


async def test_response_format_with_tools_under_auto_lets_the_real_model_call(gateway):
    """OpenAI's behaviour: a response_format does not rule tool calls out under auto (this
    model calls get_weather here; with the format alone it could only answer in JSON)."""
    client = openai.AsyncOpenAI(base_url=gateway + "/v1", api_key=tenant_key("acme"),
                                max_retries=0, timeout=300)
    done = await client.chat.completions.create(
        model="gpt-4o-mini", max_tokens=60, temperature=0.0, parallel_tool_calls=False,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=weather_tool(WEATHER),
        response_format={"type": "json_schema", "json_schema": {"name": "person",
                                                                "schema": PERSON}})
    choice = done.choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER)
    assert call.function.name == "get_weather" and arguments["city"] == "Paris"


async def test_strict_tool_under_auto_calls_with_valid_arguments(gateway):
    """A one-shot prompt makes this model call under auto; left alone it imitates the
    example's arguments ({"city": ...} only, which this schema refuses) or invents keys:
    the strict tool's grammar makes the call valid."""
    client = openai.AsyncOpenAI(base_url=gateway + "/v1", api_key=tenant_key("acme"),
                                max_retries=0, timeout=300)
    done = await client.chat.completions.create(
        model="gpt-4o-mini", max_tokens=60, temperature=0.0, parallel_tool_calls=False,
        messages=ONE_SHOT, tools=weather_tool(STRICT_WEATHER))
    (call,) = done.choices[0].message.tool_calls
    assert done.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), STRICT_WEATHER)
