"""Response bodies built from a finished generation: tool calls become tool_use blocks /
tool_calls, stop reasons map per API, usage fields add up, streams split calls from text."""
from __future__ import annotations

import json

from radixgate.gateway.anthropic.messages import MessageStream, message_body, usage_body
from radixgate.gateway.openai.chat import ChatStream, chat_body
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.render import Conversation
from radixgate.gateway.tools import forced_call_prefill
from radixgate.runtime.engine.api import Finished, FinishReason, TextDelta, Usage

USAGE = Usage(prompt_tokens=100, cache_read_tokens=60, cache_creation_tokens=30,
              cache_creation_5m_tokens=10, cache_creation_1h_tokens=20, uncached_tokens=10,
              output_tokens=7)
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
WITH_TOOLS = ConvertedPrompt(Conversation(), tool_names=("get_weather",))
NO_TOOLS = ConvertedPrompt(Conversation())


def finished(text: str, reason=FinishReason.EOS, stop=None) -> Finished:
    return Finished(reason, USAGE, text=text, stop_sequence=stop)


def test_anthropic_usage_fields_add_up_to_the_prompt():
    u = usage_body(USAGE)
    assert u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"] == 100
    assert u["cache_creation"] == {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 20}


def test_tool_call_output_becomes_tool_use_block_with_tool_use_stop_reason():
    body = message_body("msg_1", "claude-x", WITH_TOOLS, finished("Checking.\n" + CALL))
    assert [b["type"] for b in body["content"]] == ["text", "tool_use"]
    tool = body["content"][1]
    assert tool["name"] == "get_weather" and tool["input"] == {"city": "Paris"}
    assert tool["id"].startswith("toolu_")
    assert body["stop_reason"] == "tool_use"


def test_without_tools_the_same_text_stays_text_and_stop_reasons_map():
    body = message_body("msg_1", "m", NO_TOOLS, finished(CALL, FinishReason.LENGTH))
    assert body["content"] == [{"type": "text", "text": CALL}]
    assert body["stop_reason"] == "max_tokens"
    stopped = message_body("msg_2", "m", NO_TOOLS, finished("a", FinishReason.STOP_SEQUENCE, "##"))
    assert stopped["stop_reason"] == "stop_sequence" and stopped["stop_sequence"] == "##"
    assert message_body("m", "m", NO_TOOLS, finished(""))["content"] == []


def test_forced_tool_prefill_is_part_of_the_parsed_answer():
    prefix = forced_call_prefill("get_weather")
    forced = ConvertedPrompt(Conversation(), ("get_weather",), prefix)
    body = message_body("m", "m", forced, finished('{"city": "Rome"}}</tool_call>'))
    assert body["content"][0]["input"] == {"city": "Rome"}
    chat = chat_body("c", "gpt", forced, [finished('{"city": "Rome"}}</tool_call>')])
    call = chat["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}
    assert chat["choices"][0]["finish_reason"] == "tool_calls"


def test_openai_chat_body_usage_and_tool_calls():
    body = chat_body("chatcmpl-1", "gpt-4o", WITH_TOOLS, [finished(CALL)])
    message = body["choices"][0]["message"]
    assert message["content"] is None and message["tool_calls"][0]["id"].startswith("call_")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 60
    assert body["usage"]["total_tokens"] == 107
    plain = chat_body("c", "g", NO_TOOLS, [finished("hello", FinishReason.LENGTH)])
    assert plain["choices"][0]["message"]["content"] == "hello"
    assert plain["choices"][0]["finish_reason"] == "length"


def test_openai_stream_chunks_carry_tool_call_deltas_and_final_usage():
    stream = ChatStream("c", "g", WITH_TOOLS, include_usage=True)
    frames = stream.start(None)
    for piece in ("Sure ", CALL[:15], CALL[15:]):
        frames += stream.delta(TextDelta(piece))
    frames += stream.end(finished("Sure " + CALL))
    assert frames[-1] == (None, "[DONE]")
    out = [data for _, data in frames[:-1]]
    deltas = [c["choices"][0]["delta"] for c in out if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert {"content": "Sure "} in deltas
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert len(calls) == 1 and calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather"
    assert out[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert out[-1]["choices"] == [] and out[-1]["usage"]["prompt_tokens"] == 100
    assert stream.has_tool_call


def test_anthropic_stream_opens_and_closes_blocks_in_order():
    stream = MessageStream(WITH_TOOLS, "claude", "msg_1")
    frames = []
    for piece in ("Let me ", "check. ", CALL[:20], CALL[20:], "\n"):
        frames += stream.delta(TextDelta(piece))
    frames += stream.end(finished("Let me check. " + CALL + "\n"))
    assert all(name == data["type"] for name, data in frames)
    events = [data for _, data in frames]
    kinds = [(e["type"], e.get("index")) for e in events]
    assert kinds[:7] == [("content_block_start", 0), ("content_block_delta", 0),
                         ("content_block_delta", 0), ("content_block_stop", 0),
                         ("content_block_start", 1), ("content_block_delta", 1),
                         ("content_block_stop", 1)]
    assert kinds[-2:] == [("message_delta", None), ("message_stop", None)]
    assert events[4]["content_block"]["type"] == "tool_use"
    assert json.loads(events[5]["delta"]["partial_json"]) == {"city": "Paris"}
    assert stream.has_tool_call
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
