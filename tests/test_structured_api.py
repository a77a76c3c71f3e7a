"""Structured output and forced tool calls through the official SDKs (openai, anthropic) over
real HTTP, on the tiny model (random weights: only the grammar makes the output valid).
Every answer is validated with jsonschema; after each scenario the engine's blocks are
conserved (``check_integrity``)."""
from __future__ import annotations

import json
from typing import Literal

import anthropic
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from radixgate.gateway.http_util import STATE
from tests.support.engine import integrity
from tests.support.inproc import engine_of, in_process_gateway
from tests.support.server import tenant_key

MODEL = "gpt-4o-mini"
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 10},
                          "unit": {"enum": ["celsius", "fahrenheit"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["zone"],
        "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}, "24h": {"type": "boolean"}}}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
                {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": WEATHER, "strict": True},
                   {"name": "get_time", "input_schema": TIME}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
PROMPTS = ["What is the weather in Paris?", "Plan my week.", "Tell me something."]
SAMPLING = [{"temperature": 0.0}, {"temperature": 0.8, "seed": 1}, {"temperature": 1.2, "seed": 2}]
ANTHROPIC_SAMPLING = [{"temperature": 0.0}, {"temperature": 0.7}, {"temperature": 1.0}]


class Answer(BaseModel):
    verdict: Literal["yes", "no", "maybe"]
    confidence: int = Field(ge=0, le=100)
    reason: str = Field(max_length=16)


class Verdict(BaseModel):
    """For anthropic's parse, whose schema transform drops numeric and length bounds."""

    verdict: Literal["yes", "no", "maybe"]
    sure: bool


@pytest.fixture
async def gateway():
    async with in_process_gateway(tenants=("acme", "beta"), kv_cache_gb=0.004,
                                  max_model_len=1024) as (base_url, app):
        yield base_url, app
        integrity(engine_of(app))


def openai_client(base_url: str, tenant: str = "acme") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=tenant_key(tenant),
                              max_retries=0, timeout=120)


def anthropic_client(base_url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, api_key=tenant_key("acme"),
                                    max_retries=0, timeout=120)


def chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


# -- OpenAI ------------------------------------------------------------------------------

async def test_openai_json_schema_answers_validate(gateway):
    client = openai_client(gateway[0])
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER,
                                                  "strict": True}}
    for prompt, sampling in zip(PROMPTS, SAMPLING):
        done = await client.chat.completions.create(model=MODEL, messages=chat(prompt),
                                                    max_tokens=80, response_format=fmt,
                                                    **sampling)
        assert done.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(done.choices[0].message.content), WEATHER)
    stream = await client.chat.completions.create(model=MODEL, messages=chat(PROMPTS[0]),
                                                  max_tokens=80, response_format=fmt,
                                                  temperature=1.0, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    jsonschema.validate(json.loads(text), WEATHER)


async def test_openai_parse_with_a_pydantic_model(gateway):
    client = openai_client(gateway[0])
    for prompt, sampling in zip(PROMPTS, SAMPLING):
        done = await client.chat.completions.parse(model=MODEL, messages=chat(prompt),
                                                   max_tokens=80, response_format=Answer,
                                                   **sampling)
        parsed = done.choices[0].message.parsed
        assert isinstance(parsed, Answer) and 0 <= parsed.confidence <= 100


async def test_openai_json_object_is_a_json_object(gateway):
    client = openai_client(gateway[0])
    done = await client.chat.completions.create(
        model=MODEL, messages=chat("Give me JSON."), max_tokens=24, temperature=0.0,
        response_format={"type": "json_object"})
    content = done.choices[0].message.content
    assert content.startswith("{")
    if done.choices[0].finish_reason == "stop":    # a cut answer may be incomplete JSON
        assert isinstance(json.loads(content), dict)


async def test_openai_forced_calls_validate_against_their_tool(gateway):
    client = openai_client(gateway[0])
    choices = ["required", {"type": "function", "function": {"name": "get_time"}}]
    for prompt, sampling in zip(PROMPTS, SAMPLING):
        for tool_choice in choices:
            done = await client.chat.completions.create(
                model=MODEL, messages=chat(prompt), max_tokens=80, tools=OPENAI_TOOLS,
                tool_choice=tool_choice, parallel_tool_calls=False, **sampling)
            choice = done.choices[0]
            assert choice.finish_reason == "tool_calls"
            (call,) = choice.message.tool_calls
            if isinstance(tool_choice, dict):
                assert call.function.name == "get_time"
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


async def test_openai_parallel_forced_calls_are_all_valid(gateway):
    client = openai_client(gateway[0])
    done = await client.chat.completions.create(
        model=MODEL, messages=chat(PROMPTS[1]), max_tokens=160, tools=OPENAI_TOOLS,
        tool_choice="required", temperature=1.0, seed=3)
    calls = done.choices[0].message.tool_calls
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


async def test_vllm_structured_outputs_on_chat_and_completions(gateway):
    client = openai_client(gateway[0])
    cases = [({"structured_outputs": {"regex": r"[A-Z]{3}-[0-9]{2}"}},
              lambda t: len(t) == 6 and t[3] == "-"),
             ({"structured_outputs": {"choice": ["left", "right"]}}, lambda t: t in ("left", "right")),
             ({"structured_outputs": {"json": TIME}}, lambda t: jsonschema.validate(
                 json.loads(t), TIME) is None),
             ({"structured_outputs": {"grammar": 'start: "ok" | "fine"'}},
              lambda t: t in ("ok", "fine")),
             ({"guided_choice": ["a", "b"]}, lambda t: t in ("a", "b")),
             ({"guided_regex": r"[0-9]{4}"}, lambda t: t.isdigit() and len(t) == 4),
             ({"guided_json": TIME}, lambda t: jsonschema.validate(json.loads(t), TIME) is None)]
    for extra, check in cases:
        for sampling in SAMPLING[:2]:
            done = await client.chat.completions.create(model=MODEL, messages=chat("Go"),
                                                        max_tokens=40, extra_body=extra,
                                                        **sampling)
            assert check(done.choices[0].message.content), (extra, done)
            text = (await client.completions.create(model=MODEL, prompt="Go", max_tokens=40,
                                                    extra_body=extra, **sampling)).choices[0].text
            assert check(text), (extra, text)


async def test_responses_text_format_json_schema(gateway):
    client = openai_client(gateway[0])
    for prompt, temperature in zip(PROMPTS, (0.0, 1.0)):
        done = await client.responses.create(
            model=MODEL, input=prompt, max_output_tokens=80, temperature=temperature,
            text={"format": {"type": "json_schema", "name": "weather", "schema": WEATHER,
                             "strict": True}})
        jsonschema.validate(json.loads(done.output_text), WEATHER)
        assert done.text.format.type == "json_schema"


# -- Anthropic ---------------------------------------------------------------------------

async def test_anthropic_forced_tool_use_validates(gateway):
    client = anthropic_client(gateway[0])
    choices = [{"type": "any", "disable_parallel_tool_use": True},
               {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}]
    for prompt, sampling in zip(PROMPTS, ANTHROPIC_SAMPLING):
        for tool_choice in choices:
            done = await client.messages.create(model=MODEL, messages=chat(prompt),
                                                max_tokens=80, tools=ANTHROPIC_TOOLS,
                                                tool_choice=tool_choice, extra_body=sampling)
            assert done.stop_reason == "tool_use"
            (use,) = [b for b in done.content if b.type == "tool_use"]
            if tool_choice["type"] == "tool":
                assert use.name == "get_weather"
            jsonschema.validate(use.input, SCHEMAS[use.name])


async def test_anthropic_streamed_forced_tool_use_validates(gateway):
    client = anthropic_client(gateway[0])
    async with client.messages.stream(
            model=MODEL, messages=chat(PROMPTS[0]), max_tokens=80, tools=ANTHROPIC_TOOLS,
            tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
            extra_body={"temperature": 1.0}) as stream:
        message = await stream.get_final_message()
    (use,) = [b for b in message.content if b.type == "tool_use"]
    jsonschema.validate(use.input, TIME)


async def test_anthropic_output_config_and_beta_output_format(gateway):
    client = anthropic_client(gateway[0])
    for prompt, sampling in zip(PROMPTS, ANTHROPIC_SAMPLING):
        done = await client.messages.create(
            model=MODEL, messages=chat(prompt), max_tokens=80, extra_body=sampling,
            output_config={"format": {"type": "json_schema", "schema": WEATHER}})
        assert done.stop_reason == "end_turn"
        jsonschema.validate(json.loads(done.content[0].text), WEATHER)
    beta = await client.messages.create(
        model=MODEL, messages=chat(PROMPTS[0]), max_tokens=80,
        extra_body={"temperature": 1.0, "output_format": {"type": "json_schema", "schema": TIME}})
    jsonschema.validate(json.loads(beta.content[0].text), TIME)
    parsed = await client.messages.parse(model=MODEL, messages=chat(PROMPTS[1]), max_tokens=80,
                                         output_format=Verdict, extra_body={"temperature": 0.9})
    assert isinstance(parsed.parsed_output, Verdict)


# -- bad input, the compile cache --------------------------------------------------------

async def test_bad_schemas_are_a_400_naming_the_problem_before_queueing(gateway):
    base_url, app = gateway
    client = openai_client(base_url)
    bad = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}
    cases = [({"response_format": {"type": "json_schema",
                                   "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
              "response_format.json_schema.schema.*strin"),
             ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                          "schema": bad}}},
              "not"),
             ({"extra_body": {"structured_outputs": {"regex": "a" * 5000}}}, "at most"),
             ({"extra_body": {"structured_outputs": {"regex": "(a"}}}, "structured_outputs.regex"),
             ({"extra_body": {"guided_regex": "a", "guided_choice": ["a"]}}, "only one")]
    before = engine_of(app).request_snapshot().result(timeout=30).finished
    for kwargs, named in cases:
        with pytest.raises(openai.BadRequestError, match=named):
            await client.chat.completions.create(model=MODEL, messages=chat("x"),
                                                 max_tokens=4, **kwargs)
    with pytest.raises(anthropic.BadRequestError, match="output_config.format.schema"):
        await anthropic_client(base_url).messages.create(
            model=MODEL, messages=chat("x"), max_tokens=4,
            output_config={"format": {"type": "json_schema", "schema": {"type": "strin"}}})
    assert engine_of(app).request_snapshot().result(timeout=30).finished == before


async def test_compiled_grammars_are_cached_per_tenant(gateway):
    base_url, app = gateway
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": TIME}}
    for tenant in ("acme", "acme", "beta"):
        await openai_client(base_url, tenant).chat.completions.create(
            model=MODEL, messages=chat("x"), max_tokens=30, response_format=fmt)
    assert app[STATE].grammars.compiles == 2


async def test_strict_tools_with_auto_choice_give_text_or_valid_calls(gateway):
    """Strict tools under ``auto``: the answer is free text or text then calls whose
    arguments match (the tiny model may take either way; both are checked)."""
    base_url = gateway[0]
    openai_tools = [{"type": "function", "function": {"name": "get_weather", "strict": True,
                                                      "parameters": WEATHER}}]
    for prompt, sampling in zip(PROMPTS, SAMPLING):
        done = await openai_client(base_url).chat.completions.create(
            model=MODEL, messages=chat(prompt), max_tokens=40, tools=openai_tools,
            parallel_tool_calls=False, **sampling)
        message = done.choices[0].message
        for call in message.tool_calls or []:
            jsonschema.validate(json.loads(call.function.arguments), WEATHER)
        assert "<tool_call>" not in (message.content or "")
    for prompt, sampling in zip(PROMPTS[:2], ANTHROPIC_SAMPLING[1:]):
        done = await anthropic_client(base_url).messages.create(
            model=MODEL, messages=chat(prompt), max_tokens=40, tools=ANTHROPIC_TOOLS,
            extra_body=sampling)
        for block in done.content:
            if block.type == "tool_use" and block.name == "get_weather":
                jsonschema.validate(block.input, WEATHER)
            if block.type == "text":
                assert "<tool_call>" not in block.text


@pytest.mark.parametrize("text, allowed", [
    ('Let me check. <tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>',
     True),
    ("Just text, a < b, no call.", True),
    ('<tool_call>{"name": "get_weather", "arguments": {"any": "thing"}}</tool_call>', True),
    ('Hi <tool_call>{"name": "get_time", "arguments": {"zone": "XXX"}}</tool_call>', False),
    ('Hi <tool_call>{"name": "other", "arguments": {}}</tool_call>', False),
])
def test_strict_auto_grammar_admits_text_and_valid_calls_only(text, allowed):
    from radixgate.gateway.structured import strict_tool_calls
    from radixgate.gateway.tools import ToolSpec
    from radixgate.runtime.grammar import GrammarCompiler
    from tests.support.engine import tiny_model
    model = tiny_model()
    specs = [ToolSpec("get_weather", None, WEATHER), ToolSpec("get_time", None, TIME)]
    source = strict_tool_calls("tools", specs, {"get_time"}, parallel=False).source
    grammar = GrammarCompiler(model.tokenizer, model.config.vocab_size).compile(source).matcher()
    ids = model.tokenizer.encode(text)
    accepted = grammar.matcher.validate_tokens(ids) == len(ids)
    assert accepted == allowed


async def test_openai_json_schema_with_n_choices_and_logprobs(gateway):
    client = openai_client(gateway[0])
    fmt = {"type": "json_schema", "json_schema": {"name": "time", "schema": TIME}}
    done = await client.chat.completions.create(
        model=MODEL, messages=chat("What time is it?"), max_tokens=40, n=2, temperature=1.0,
        seed=5, logprobs=True, response_format=fmt)
    for choice in done.choices:
        jsonschema.validate(json.loads(choice.message.content), TIME)
        assert "".join(t.token for t in choice.logprobs.content) == choice.message.content
