"""Structured output and forced tool calls through the official SDKs (openai, anthropic) over
real HTTP, on the tiny model (random weights: only the grammar makes the output valid).
Every answer is validated with jsonschema; after each scenario the engine's blocks are
conserved (``check_integrity``)."""
from __future__ import annotations

import json
import re
from typing import Literal

import anthropic
import jiter
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


def assert_json_object_prefix(text: str) -> None:
    """``text`` is a JSON object, or the start of one cut short (nothing after its end)."""
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except ValueError:                        # incomplete: parse it as a cut document
        value, end = jiter.from_json(text.encode(), partial_mode="trailing-strings"), len(text)
    assert isinstance(value, dict) and end == len(text), text


async def test_openai_json_object_is_a_json_object(gateway):
    client = openai_client(gateway[0])
    reasons = set()
    for max_tokens, temperature in ((24, 0.0), (7, 1.0), (12, 1.3)):
        done = await client.chat.completions.create(
            model=MODEL, messages=chat("Give me JSON."), max_tokens=max_tokens,
            temperature=temperature, seed=1, response_format={"type": "json_object"})
        choice = done.choices[0]
        reasons.add(choice.finish_reason)
        assert_json_object_prefix(choice.message.content)
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)
    assert "length" in reasons                 # a cut answer was checked too


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


NEWLINE, LT, BRACE = "198", "44", "107"     # token ids of "\n", "<" and "{" (logit_bias)


async def test_openai_parallel_forced_calls_are_all_valid(gateway):
    """A newline after a call starts another one: the bias makes the model take it."""
    client = openai_client(gateway[0])
    done = await client.chat.completions.create(
        model=MODEL, messages=chat(PROMPTS[1]), max_tokens=160, tools=OPENAI_TOOLS,
        tool_choice="required", temperature=1.0, seed=3, logit_bias={NEWLINE: 100})
    calls = done.choices[0].message.tool_calls
    assert len(calls) >= 2, done
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


async def test_a_named_tool_choice_makes_exactly_one_call(gateway):
    """OpenAI's named tool_choice calls exactly one function: a newline (biased up, which
    would start a parallel call) is not allowed after it, whatever parallel_tool_calls."""
    client = openai_client(gateway[0])
    for stream in (False, True):
        kwargs = dict(model=MODEL, messages=chat(PROMPTS[0]), max_tokens=120,
                      tools=OPENAI_TOOLS, temperature=1.0, seed=4, logit_bias={NEWLINE: 100},
                      tool_choice={"type": "function", "function": {"name": "get_time"}})
        if not stream:
            done = await client.chat.completions.create(**kwargs)
            (call,) = done.choices[0].message.tool_calls
            assert done.choices[0].finish_reason == "tool_calls"
            calls = [(call.function.name, call.function.arguments)]
        else:
            chunks = [c async for c in await client.chat.completions.create(stream=True,
                                                                            **kwargs)]
            deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
            calls = [(d.function.name, d.function.arguments) for d in deltas]
            assert len({d.index for d in deltas}) == 1
            assert chunks[-1].choices[0].finish_reason == "tool_calls"
        (name, arguments), = calls
        assert name == "get_time"
        jsonschema.validate(json.loads(arguments), TIME)


FORMAT = {"type": "object", "additionalProperties": False, "required": ["verdict"],
          "properties": {"verdict": {"enum": ["yes", "no"]}}}
STRICT_TOOLS = [{"type": "function", "function": {"name": n, "parameters": s, "strict": True}}
                for n, s in SCHEMAS.items()]


async def test_response_format_with_tools_under_auto_calls_or_answers_in_the_format(gateway):
    """OpenAI's behaviour: under tool_choice auto the model may call a tool (the first
    token biased to "<") or answer in the format (biased to "{")."""
    client = openai_client(gateway[0])
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": FORMAT}}
    for tools in (OPENAI_TOOLS[:1] + STRICT_TOOLS[1:], STRICT_TOOLS):
        called = await client.chat.completions.create(
            model=MODEL, messages=chat(PROMPTS[0]), max_tokens=80, tools=tools,
            response_format=fmt, temperature=0.0, logit_bias={LT: 100},
            parallel_tool_calls=False)
        choice = called.choices[0]
        assert choice.finish_reason == "tool_calls", called
        (call,) = choice.message.tool_calls
        assert not choice.message.content
        arguments = json.loads(call.function.arguments)
        if call.function.name in {t["function"]["name"] for t in tools
                                  if t["function"].get("strict")}:
            jsonschema.validate(arguments, SCHEMAS[call.function.name])
        answered = await client.chat.completions.create(
            model=MODEL, messages=chat(PROMPTS[0]), max_tokens=80, tools=tools,
            response_format=fmt, temperature=0.0, logit_bias={BRACE: 100})
        assert answered.choices[0].finish_reason == "stop" and not answered.choices[0].message.tool_calls
        jsonschema.validate(json.loads(answered.choices[0].message.content), FORMAT)


async def test_vllm_structured_outputs_on_chat_and_completions(gateway):
    client = openai_client(gateway[0])
    cases = [({"structured_outputs": {"regex": r"[A-Z]{3}-[0-9]{2}"}},
              lambda t: re.fullmatch(r"[A-Z]{3}-[0-9]{2}", t)),
             ({"structured_outputs": {"choice": ["left", "right"]}}, lambda t: t in ("left", "right")),
             ({"structured_outputs": {"json": TIME}}, lambda t: jsonschema.validate(
                 json.loads(t), TIME) is None),
             ({"structured_outputs": {"grammar": 'start: "ok" | "fine"'}},
              lambda t: t in ("ok", "fine")),
             ({"guided_choice": ["a", "b"]}, lambda t: t in ("a", "b")),
             ({"guided_regex": r"[0-9]{4}"}, lambda t: re.fullmatch(r"[0-9]{4}", t)),
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


async def test_unknown_keys_inside_structured_output_fields_are_a_400_naming_them(gateway):
    """A misspelled or unsupported key would otherwise drop the constraint silently; the
    error is OpenAI's (type, param) on chat, completions and Responses."""
    base_url, app = gateway
    client = openai_client(base_url)
    chat_cases = [
        ({"extra_body": {"structured_outputs": {"structural_tag": '{"type": "x"}'}}},
         "structured_outputs.structural_tag"),
        ({"extra_body": {"structured_outputs": {"regx": "[0-9]+"}}}, "structured_outputs.regx"),
        ({"extra_body": {"structured_outputs": {}}}, "structured_outputs"),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "t", "schema": TIME, "strictt": True}}}, "response_format.json_schema.strictt"),
        ({"response_format": {"type": "json_object", "schema": TIME}}, "response_format.schema")]
    before = engine_of(app).request_snapshot().result(timeout=30).finished
    for kwargs, param in chat_cases:
        with pytest.raises(openai.BadRequestError) as raised:
            await client.chat.completions.create(model=MODEL, messages=chat("x"),
                                                 max_tokens=4, **kwargs)
        assert raised.value.body["param"] == param and param in raised.value.body["message"]
        assert raised.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as raised:
        await client.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body={
            "structured_outputs": {"choise": ["a", "b"]}})
    assert raised.value.body["param"] == "structured_outputs.choise"
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model=MODEL, input="x", max_output_tokens=4, text={
            "format": {"type": "json_schema", "name": "t", "shema": TIME}})
    assert raised.value.body["param"] == "text.format.shema"
    assert engine_of(app).request_snapshot().result(timeout=30).finished == before
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=chat("x"), max_tokens=4, extra_body={
            "frobnicate": 1, "structured_outputs": {"choice": ["a", "b"],
                                                    "disable_any_whitespace": True}})
    assert raw.headers["x-radixgate-ignored-fields"] == "frobnicate"
    assert raw.parse().choices[0].message.content in ("a", "b")


async def test_compiled_grammars_are_cached_per_tenant(gateway):
    base_url, app = gateway
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": TIME}}
    for tenant in ("acme", "acme", "beta"):
        await openai_client(base_url, tenant).chat.completions.create(
            model=MODEL, messages=chat("x"), max_tokens=30, response_format=fmt)
    assert app[STATE].grammars.compiles == 2


async def test_strict_tools_with_auto_choice_give_text_or_valid_calls(gateway):
    """Strict tools under ``auto``: the answer is free text or text then calls whose
    arguments match (the tiny model may take either way; both are checked). No bias makes
    the tiny model write ``<tool_call>`` here (free text admits "<" at every step), so the
    case that calls is on the real model (test_structured_realmodel.py,
    ``test_strict_tool_under_auto_calls_with_valid_arguments``)."""
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
    from radixgate.gateway.constraints import strict_tool_calls
    from radixgate.gateway.tools import ToolSpec
    from radixgate.runtime.engine.grammar import GrammarCompiler
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


TWO_CALLS_AFTER_PREFILL = ('{"zone": "UTC"}}</tool_call>\n<tool_call>{"name": "get_time", '
                           '"arguments": {"zone": "CET"}}</tool_call>')


def converted_for(api: str, tool_choice) -> object:
    """The ConvertedPrompt of a request with the two tools and ``tool_choice``."""
    from radixgate.gateway.anthropic.convert import convert_messages_request
    from radixgate.gateway.openai.responses.convert import convert_first_turn
    from radixgate.gateway.anthropic.schemas import MessagesRequest
    from radixgate.gateway.openai.responses.schemas import ResponsesRequest
    if api == "responses":
        tools = [{"type": "function", **t["function"]} for t in OPENAI_TOOLS]
        return convert_first_turn(ResponsesRequest.model_validate(
            {"input": "x", "tools": tools, "tool_choice": tool_choice})).converted
    return convert_messages_request(MessagesRequest.model_validate(
        {"model": MODEL, "max_tokens": 8, "messages": chat("x"), "tools": ANTHROPIC_TOOLS,
         "tool_choice": tool_choice}))


@pytest.mark.parametrize("api, tool_choice, calls", [
    ("responses", {"type": "function", "name": "get_time"}, 1),
    ("anthropic", {"type": "tool", "name": "get_time"}, 2),
    ("anthropic", {"type": "tool", "name": "get_time", "disable_parallel_tool_use": True}, 1),
])
def test_a_named_tool_choice_allows_more_calls_only_on_anthropic(api, tool_choice, calls):
    """Responses' named function is "call exactly one" (OpenAI); Anthropic's
    ``{"type": "tool"}`` allows parallel calls unless ``disable_parallel_tool_use``."""
    from radixgate.runtime.engine.grammar import GrammarCompiler
    from tests.support.engine import tiny_model
    converted = converted_for(api, tool_choice)
    model = tiny_model()
    grammar = GrammarCompiler(model.tokenizer, model.config.vocab_size).compile(
        converted.constraint.source).matcher()
    ids = model.tokenizer.encode(TWO_CALLS_AFTER_PREFILL)
    assert (grammar.matcher.validate_tokens(ids) == len(ids)) == (calls == 2)
    assert converted.max_tool_calls == (None if calls == 2 else 1)
