"""Over HTTP on the tiny model: a forced call that ``max_tokens`` cuts reports the cut on
every API, whole and streamed, and the prompt format's markup never reaches a client's
text (before the fix, the cut call came back as ``<tool_call>...`` text)."""
from __future__ import annotations

import json

import pytest

from tests.support.client import headers, parse_sse
from tests.support.inproc import in_process_gateway
from tests.support.server import tenant_key

KEY = headers(tenant_key("acme"))
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
PROMPT = "What is the weather in Paris?"
MAX_TOKENS = 6           # the random model's call is cut inside its arguments


def chat_body(stream: bool) -> dict:
    return {"model": "gpt-4o-mini", "max_tokens": MAX_TOKENS, "stream": stream,
            "messages": [{"role": "user", "content": PROMPT}],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                                                        "parameters": SCHEMA}}],
            "tool_choice": "required"}


def anthropic_body(stream: bool) -> dict:
    return {"model": "claude-x", "max_tokens": MAX_TOKENS, "stream": stream,
            "messages": [{"role": "user", "content": PROMPT}],
            "tools": [{"name": "get_weather", "input_schema": SCHEMA}],
            "tool_choice": {"type": "tool", "name": "get_weather"}}


def responses_body(stream: bool) -> dict:
    return {"model": "gpt-4o-mini", "max_output_tokens": MAX_TOKENS, "stream": stream,
            "input": PROMPT, "tool_choice": "required",
            "tools": [{"type": "function", "name": "get_weather", "parameters": SCHEMA}]}


def chat_answer(raw: str, stream: bool) -> tuple[str, str]:
    """(the text content, the finish reason)."""
    if not stream:
        choice = json.loads(raw)["choices"][0]
        return choice["message"]["content"] or "", choice["finish_reason"]
    chunks = [json.loads(d) for _, d in parse_sse(raw) if d != "[DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    return text, chunks[-1]["choices"][0]["finish_reason"]


def anthropic_answer(raw: str, stream: bool) -> tuple[str, str]:
    if not stream:
        body = json.loads(raw)
        return "".join(b.get("text", "") for b in body["content"]), body["stop_reason"]
    events = [json.loads(d) for _, d in parse_sse(raw)]
    text = "".join(e["delta"].get("text", "") for e in events
                   if e["type"] == "content_block_delta")
    (delta,) = [e["delta"] for e in events if e["type"] == "message_delta"]
    return text, delta["stop_reason"]


def responses_answer(raw: str, stream: bool) -> tuple[str, str]:
    if stream:
        events = [json.loads(d) for _, d in parse_sse(raw)]
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        body = events[-1]["response"]
    else:
        body = json.loads(raw)
        text = ""
    text += "".join(part["text"] for item in body["output"] if item["type"] == "message"
                    for part in item["content"])
    reason = (body["incomplete_details"] or {}).get("reason")
    return text, f'{body["status"]}/{reason}'


APIS = {"chat": ("/v1/chat/completions", chat_body, chat_answer, "length"),
        "anthropic": ("/v1/messages", anthropic_body, anthropic_answer, "max_tokens"),
        "responses": ("/v1/responses", responses_body, responses_answer,
                      "incomplete/max_output_tokens")}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_cut_forced_call_reports_the_cut_and_no_markup_on_every_api(http, stream):
    async with in_process_gateway(tenants=("acme",)) as (base_url, _):
        for name, (path, body, answer, cut) in APIS.items():
            async with http.post(base_url + path, json=body(stream), headers=KEY) as response:
                raw = await response.text()
                assert response.status == 200, raw
            text, reason = answer(raw, stream)
            assert "<tool" not in text and text == "", (name, raw)
            assert reason == cut, (name, raw)
