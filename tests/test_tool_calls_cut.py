"""A forced call cut by ``max_tokens`` reports the cut on every API, in bodies and streams:
OpenAI chat ``length`` with the partial call in ``tool_calls`` (its arguments the JSON text
so far), Anthropic ``max_tokens`` with the calls that finished, Responses ``incomplete``
(``max_output_tokens``) with the finished calls; and no API's content ever carries the
prompt format's markup."""
from __future__ import annotations

import json

import anthropic.types
import openai.types.chat
import openai.types.responses
import pytest

from radixgate.gateway.anthropic.messages import MessageStream, message_body
from radixgate.gateway.openai.chat import ChatStream, chat_body
from radixgate.gateway.openai.responses import api as responses_api
from radixgate.gateway.openai.responses.convert import convert_first_turn
from radixgate.gateway.openai.responses.schemas import ResponsesRequest
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.render import Conversation
from radixgate.gateway.tools import forced_call_prefill
from radixgate.runtime.engine.api import Finished, FinishReason, TextDelta, Usage

NAME = "get_weather"
PREFIX = forced_call_prefill(NAME)
FORCED = ConvertedPrompt(Conversation(), (NAME,), PREFIX)
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
SECOND = '\n<tool_call>{"name": "get_weather", "arguments": {"city": "Ro'
USAGE = Usage(prompt_tokens=20, uncached_tokens=20, output_tokens=16)
AFTER_ONE = CALL[len(PREFIX):] + SECOND          # one call finished, the second cut
IN_FIRST = CALL[len(PREFIX):][:8]                # cut inside the only call: '{"city":'


def finished(text: str, reason=FinishReason.LENGTH) -> Finished:
    return Finished(reason, USAGE, text=text)


def in_pieces(text: str, size: int = 3) -> list[TextDelta]:
    return [TextDelta(text[i:i + size]) for i in range(0, len(text), size)]


def no_markup(value) -> None:
    assert "<tool" not in json.dumps(value).replace('"name": "get_weather"', ""), value


# -- OpenAI chat ---------------------------------------------------------------------------

def chat_stream_result(converted, text, reason=FinishReason.LENGTH) -> tuple[list, str]:
    stream = ChatStream("c", "gpt", converted, include_usage=False)
    frames = stream.start(None)
    for delta in in_pieces(text):
        frames += stream.delta(delta)
    frames += stream.end(finished(text, reason))
    chunks = [openai.types.chat.ChatCompletionChunk.model_validate(data)
              for _, data in frames if data != "[DONE]"]
    calls = [c for chunk in chunks for c in chunk.choices[0].delta.tool_calls or []]
    text_out = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text_out == ""
    return calls, chunks[-1].choices[0].finish_reason


def test_chat_a_call_cut_after_a_finished_one_is_length_with_the_partial_call():
    body = chat_body("c", "gpt", FORCED, [finished(AFTER_ONE)])
    choice = openai.types.chat.ChatCompletion.model_validate(body).choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    first, partial = choice.message.tool_calls
    assert json.loads(first.function.arguments) == {"city": "Paris"}
    assert partial.function.name == NAME and partial.function.arguments == '{"city": "Ro'
    calls, reason = chat_stream_result(FORCED, AFTER_ONE)
    assert reason == "length" and [c.index for c in calls] == [0, 1]
    assert calls[1].function.arguments == '{"city": "Ro'


def test_chat_a_cut_inside_the_only_call_is_the_partial_call_not_text():
    body = chat_body("c", "gpt", FORCED, [finished(IN_FIRST)])
    no_markup(body["choices"][0]["message"]["content"])
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == '{"city":'
    assert body["choices"][0]["finish_reason"] == "length"
    calls, reason = chat_stream_result(FORCED, IN_FIRST)
    assert reason == "length" and calls[0].function.arguments == '{"city":'


def test_chat_a_call_completed_by_the_last_allowed_token_is_a_tool_call():
    body = chat_body("c", "gpt", FORCED, [finished(CALL[len(PREFIX):])])
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert chat_stream_result(FORCED, CALL[len(PREFIX):])[1] == "tool_calls"


# -- Anthropic messages --------------------------------------------------------------------

def anthropic_stream_events(text: str) -> list:
    stream = MessageStream(FORCED, "claude", "msg_1")
    frames = stream.start(finished(""))
    for delta in in_pieces(text):
        frames += stream.delta(delta)
    frames += stream.end(finished(text))
    assert not stream.has_tool_call        # a cut answer expects no tool results
    return [data for _, data in frames]


@pytest.mark.parametrize("text, calls", [(AFTER_ONE, 1), (IN_FIRST, 0)])
def test_anthropic_a_cut_call_is_max_tokens_with_the_finished_calls_only(text, calls):
    body = message_body("msg_1", "claude", FORCED, finished(text))
    message = anthropic.types.Message.model_validate(body)
    assert message.stop_reason == "max_tokens"
    assert [b.type for b in message.content] == ["tool_use"] * calls
    events = anthropic_stream_events(text)
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["tool_use"] * calls
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"


# -- Responses -----------------------------------------------------------------------------

def forced_turn():
    body = ResponsesRequest.model_validate({
        "model": "gpt-4o-mini", "input": "Weather in Paris?", "max_output_tokens": 16,
        "tool_choice": {"type": "function", "name": NAME},
        "tools": [{"type": "function", "name": NAME, "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}]})
    return body, convert_first_turn(body)


@pytest.mark.parametrize("text, calls", [(AFTER_ONE, 1), (IN_FIRST, 0)])
def test_responses_a_cut_call_is_incomplete_with_the_finished_calls(text, calls):
    body, turn = forced_turn()
    builder = responses_api.ResponseBuilder(body, turn)
    response = builder.final(finished(text), builder.output_items(finished(text)))
    parsed = openai.types.responses.Response.model_validate(response)
    assert parsed.status == "incomplete"
    assert parsed.incomplete_details.reason == "max_output_tokens"
    assert [i.type for i in parsed.output if i.type == "function_call"] == ["function_call"] * calls
    no_markup([i.model_dump() for i in parsed.output if i.type == "message"])
    stream = responses_api.ResponseStream(responses_api.ResponseBuilder(body, turn),
                                          lambda *a: None)
    frames = stream.start(None)
    for delta in in_pieces(text):
        frames += stream.delta(delta)
    frames += stream.end(finished(text))
    assert frames[-1][0] == "response.incomplete" and not stream.has_tool_call
    no_markup([data for kind, data in frames if "output_text" in kind])
    final = openai.types.responses.Response.model_validate(frames[-1][1]["response"])
    assert [i.type for i in final.output if i.type == "function_call"] == ["function_call"] * calls


def test_responses_a_finished_call_is_completed():
    body, turn = forced_turn()
    builder = responses_api.ResponseBuilder(body, turn)
    done = finished(CALL[len(PREFIX):])
    response = builder.final(done, builder.output_items(done))
    assert response["status"] == "completed" and response["incomplete_details"] is None
