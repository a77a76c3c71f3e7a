"""OpenAI Responses API (POST /v1/responses) through the official ``openai`` SDK over
loopback: message output and usage, the stream's events, ``previous_response_id``
continuing from the stored turn's token ids (its KV reused: cached_tokens covers the whole
earlier turn), ``store: false`` and other tenants' ids (404), ``prompt_cache_retention``
pins, forced function calls and their outputs, unsupported inputs (400). The continuation
render and the response store are also tested on their own."""
from __future__ import annotations

import json
from array import array

import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from radixgate.gateway import output
from radixgate.gateway.openai.responses import api as responses_api
from radixgate.gateway.openai.responses.convert import continuation_base, stored_tokens
from radixgate.gateway.render import render_continuation
from radixgate.gateway.render import ChatMessage, Conversation, Piece, RenderBudget, render_prompt
from radixgate.gateway.openai.responses.store import ResponseStore, StoredTurn
from radixgate.gateway.tools import ToolCallParser, split_output
from radixgate.runtime.engine.api import TextDelta
from tests.support.engine import tiny_model
from tests.support.inproc import in_process_gateway
from tests.support import client as c
from tests.support.server import ServerSpec, shared_server, tenant_key

SPEC = ServerSpec(tenants=("resp_one", "resp_two"), max_pinned_tokens=4096, kv_cache_gb=0.008)
MODEL = "gpt-4o-mini"
# additionalProperties true: the forced call's random 4 tokens then end on a sampled token
# (a closed object makes the grammar force the last ones, appended without their KV, and the
# follow-up's cached count below would be less than earlier - 1)
TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "additionalProperties": True}}
STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


def make_client(server, tenant: str = "resp_one") -> openai.OpenAI:
    return c.openai_client(server, tenant)


@pytest.fixture(scope="module")
def client(server):
    return make_client(server)


def unique_text(words: int = 30) -> str:
    return c.unique_text(words)


def respond(client, **kwargs):
    kwargs.setdefault("max_output_tokens", 5)
    kwargs.setdefault("temperature", 0)
    return client.responses.create(model=MODEL, **kwargs)


# -- over HTTP, against the --tiny server --------------------------------------------------

def test_create_renders_like_chat_and_reports_usage(client):
    system, question = unique_text(), "What is in the context?"
    response = respond(client, instructions=system, input=question)
    chat = client.chat.completions.create(
        model=MODEL, max_tokens=5, temperature=0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}])
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "incomplete" or response.status == "completed"
    item = response.output[0]
    assert item.type == "message" and item.role == "assistant"
    assert item.content[0].type == "output_text"
    assert response.output_text == chat.choices[0].message.content     # greedy, same prompt
    usage = response.usage
    assert usage.input_tokens == chat.usage.prompt_tokens               # the same render
    assert usage.output_tokens <= 5 and usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens < usage.input_tokens
    if response.status == "incomplete":
        assert response.incomplete_details.reason == "max_output_tokens"
    assert client.responses.retrieve(response.id).output_text == response.output_text
    raw = client.responses.with_raw_response.retrieve(response.id).http_response.json()
    Response.model_validate(raw)                   # strict: every field the SDK types name


def test_stream_sends_numbered_events_the_sdk_accumulates(client):
    system = unique_text(20)
    events = list(respond(client, instructions=system, input="hi", stream=True))
    kinds = [e.type for e in events]
    for event in events:                           # strict, not the SDK's lenient parse
        STREAM_EVENT.validate_python(event.model_dump(exclude_unset=True))
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert done.output_text == text and done.usage.output_tokens <= 5
    assert respond(client, instructions=system, input="hi").output_text == text
    with client.responses.stream(model=MODEL, instructions=system, input="hi",
                                 max_output_tokens=5, temperature=0) as stream:
        helped = list(stream)
    assert [e.type for e in helped] == kinds


def test_previous_response_id_reuses_the_whole_earlier_turn(client):
    first = respond(client, instructions=unique_text(), input="Tell me more.", max_output_tokens=8)
    second = respond(client, previous_response_id=first.id, input="And then?")
    earlier = first.usage.input_tokens + first.usage.output_tokens
    # Everything the engine computed is reused; only the earlier turn's last output token
    # (sampled, never fed back, so it has no KV) is computed again.
    assert second.usage.input_tokens_details.cached_tokens == earlier - 1
    assert second.usage.input_tokens > earlier
    assert second.previous_response_id == first.id
    streamed = list(respond(client, previous_response_id=second.id, input="Last one.",
                            stream=True))
    usage = streamed[-1].response.usage
    assert usage.input_tokens_details.cached_tokens == (
        second.usage.input_tokens + second.usage.output_tokens - 1)


def test_continuation_keeps_the_stored_instructions(client):
    first = respond(client, instructions="Be brief.", input=unique_text(5))
    same = respond(client, previous_response_id=first.id, instructions="Be brief.", input="ok")
    assert same.instructions == "Be brief."
    with pytest.raises(openai.BadRequestError, match="instructions"):
        respond(client, previous_response_id=first.id, instructions="Be long.", input="ok")


def test_store_false_is_not_kept(client):
    response = respond(client, input=unique_text(5), store=False)
    with pytest.raises(openai.NotFoundError, match="not found"):
        respond(client, previous_response_id=response.id, input="again")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_another_tenants_response_is_not_found(server, client):
    other = make_client(server, "resp_two")
    response = respond(client, input=unique_text(5))
    with pytest.raises(openai.NotFoundError):
        respond(other, previous_response_id=response.id, input="mine now?")
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(response.id)
    assert client.responses.retrieve(response.id).id == response.id
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_prompt_cache_retention_24h_pins_the_prompt(client):
    pinned = respond(client, input=unique_text(), prompt_cache_retention="24h",
                     prompt_cache_key="agent-7")
    details = pinned.usage.input_tokens_details
    assert details.cache_write_tokens == pinned.usage.input_tokens - 1 - details.cached_tokens
    plain = respond(client, input=unique_text(), prompt_cache_retention="in_memory")
    assert plain.usage.input_tokens_details.cache_write_tokens == 0
    assert pinned.prompt_cache_retention == "24h" and pinned.prompt_cache_key == "agent-7"


@pytest.mark.parametrize("kwargs, named", [
    ({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "https://example.com/a.png"}]}]}, "input_image"),
    ({"input": [{"type": "input_file", "file_id": "f"}]}, "input_file"),
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}, "hi"]}, "input"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "web_search"),
    ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "schema": {"type": "strin"}}}},
     "text.format"),
    ({"input": "hi", "truncation": "auto"}, "truncation"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": [{"role": "developer", "content": "only a system part"}]}, "input"),
])
def test_unsupported_inputs_are_a_400_naming_them(client, kwargs, named):
    with pytest.raises(openai.BadRequestError, match=named):
        respond(client, **kwargs)


# -- function calls: in process, the parser's verdict replaced -----------------------------
# The tiny model's random output is never a valid call (see test_gateway_continuation), so
# these tests replace what the output parser finds with CALL; the forced prefill, the
# items, the events and the follow-up's prompt are the real ones.

class _CallingParser(ToolCallParser):
    """Drops the model's text and finds CALL at the end."""

    def feed(self, text):
        return []

    def finish(self):
        return super().feed(CALL) + super().finish()


@pytest.fixture
def calls_found(monkeypatch):
    monkeypatch.setattr(output, "split_output",
                        lambda text, names, prefix, max_calls=None: split_output(CALL, names, prefix))
    monkeypatch.setattr(output, "ToolCallParser", _CallingParser)


async def test_forced_function_call_and_its_output_continue_the_turn(calls_found):
    async with in_process_gateway(tenants=("acme",)) as (base_url, _):
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=tenant_key("acme"),
                                    max_retries=0, timeout=60)
        question = "What is the weather in Paris?"
        forced = {"type": "function", "name": "get_weather"}
        first = await client.responses.create(model=MODEL, input=question, tools=[TOOL],
                                              tool_choice=forced, max_output_tokens=4,
                                              temperature=0)
        chat = await client.chat.completions.create(
            model=MODEL, max_tokens=4, temperature=0, messages=[{"role": "user",
                                                                 "content": question}],
            tools=[{"type": "function", "function": {k: v for k, v in TOOL.items()
                                                     if k != "type"}}],
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        assert first.usage.input_tokens == chat.usage.prompt_tokens   # prefill included
        call = first.output[0]
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
        assert first.status == "completed" and first.tools[0].name == "get_weather"
        follow = await client.responses.create(
            model=MODEL, previous_response_id=first.id, tools=[TOOL], max_output_tokens=4,
            temperature=0, input=[{"type": "function_call_output", "call_id": call.call_id,
                                   "output": "Sunny, 21 C"}])
        earlier = first.usage.input_tokens + first.usage.output_tokens
        assert follow.usage.input_tokens_details.cached_tokens == earlier - 1
        with pytest.raises(openai.BadRequestError, match="tools"):
            await client.responses.create(model=MODEL, previous_response_id=first.id,
                                          tools=[{**TOOL, "name": "other"}], input="x")
        events = [e async for e in await client.responses.create(
            model=MODEL, input=question, tools=[TOOL], tool_choice="required",
            max_output_tokens=4, temperature=0, stream=True)]
        kinds = [e.type for e in events]
        for event in events:
            STREAM_EVENT.validate_python(event.model_dump(exclude_unset=True))
        assert kinds[2:7] == ["response.output_item.added",
                              "response.function_call_arguments.delta",
                              "response.function_call_arguments.done",
                              "response.output_item.done", "response.completed"]
        streamed = events[-1].response.output[0]
        assert streamed.type == "function_call" and json.loads(streamed.arguments) == {
            "city": "Paris"}
        async with client.responses.stream(model=MODEL, input=question, tools=[TOOL],
                                           tool_choice="required", max_output_tokens=4,
                                           temperature=0) as stream:
            final = await stream.get_final_response()
        assert final.output[0].type == "function_call"


# -- the continuation render and the store, on their own -----------------------------------

@pytest.fixture(scope="module")
def tokenizer():
    return tiny_model().tokenizer


@pytest.mark.parametrize("ended_with_eos", [True, False])
def test_continuation_tokens_equal_the_whole_conversation_rendered(tokenizer, ended_with_eos):
    system, user = (Piece("Be brief."),), ChatMessage("user", (Piece("Hi"),))
    first = render_prompt(tokenizer, Conversation(system, (user,)))
    answer = "Hello! How can I help?"
    end = tokenizer.token_to_id("<|im_end|>")
    assert end in tokenizer.eos_token_ids
    output = tokenizer.encode_plain(answer) + ([end] if ended_with_eos else [])
    turn = StoredTurn("resp_1", stored_tokens(first.tokens, output), ("system", "user"), None,
                      (), None, {})
    base = continuation_base(turn, tokenizer.eos_token_ids)
    again = ChatMessage("user", (Piece("Again?"),))
    continued = render_continuation(tokenizer, base, turn.roles, Conversation((), (again,)),
                                    RenderBudget())
    whole = render_prompt(tokenizer, Conversation(system, (
        user, ChatMessage("assistant", (Piece(answer),)), again)))
    assert continued.tokens == whole.tokens
    assert continued.tokens[:len(first.tokens)] == first.tokens


def _turn(response_id: str, tokens: int = 10) -> StoredTurn:
    return StoredTurn(response_id, array("i", range(tokens)), ("user",), None, (), None, {})


def test_store_is_per_tenant_lru_bounded_and_expires():
    now = [0.0]
    store = ResponseStore(ttl_s=60, max_per_tenant=2, max_tokens_per_tenant=25,
                          clock=lambda: now[0])
    store.put("a", _turn("r1"))
    store.put("a", _turn("r2"))
    assert store.get("b", "r1") is None and store.get("a", "r1").response_id == "r1"
    store.put("a", _turn("r3"))                     # over the count: r2 was least recent
    assert store.get("a", "r2") is None and store.count("a") == 2
    store.put("a", _turn("big", 20))                # over the tokens: r1 and r3 go
    assert store.count("a") == 1 and store.get("a", "big") is not None
    store.put("a", _turn("huge", 26))               # larger than the bound: not stored
    assert store.get("a", "huge") is None
    now[0] = 61.0
    assert store.get("a", "big") is None and store.count("a") == 0


def test_an_error_after_the_200_is_a_response_failed_event_the_sdk_parses():
    from openai.types.responses import ResponseFailedEvent, ResponseTextDeltaEvent
    from radixgate.gateway.openai.responses.convert import convert_first_turn
    from radixgate.gateway.errors import ApiError, Kind
    from radixgate.gateway.openai.responses.schemas import ResponsesRequest
    body = ResponsesRequest.model_validate({"model": MODEL, "input": "hi"})
    stream = responses_api.ResponseStream(
        responses_api.ResponseBuilder(body, convert_first_turn(body)), lambda *a: None)
    frames = stream.start(None) + stream.delta(TextDelta("Hel")) + stream.error(
        ApiError(Kind.OVERLOADED, "the server is shutting down"))
    assert ResponseTextDeltaEvent.model_validate(frames[4][1]).delta == "Hel"
    failed = ResponseFailedEvent.model_validate(frames[-1][1])
    assert failed.response.status == "failed" and failed.response.error.code == "server_error"
    assert failed.response.output[0].content[0].text == "Hel"
    assert [data["sequence_number"] for _, data in frames] == list(range(len(frames)))
