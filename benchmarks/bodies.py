"""JSON request bodies for a ``ChatRequest``: Anthropic Messages and OpenAI Chat Completions."""
from __future__ import annotations

import json

from benchmarks.workloads import ChatRequest


def anthropic_body(req: ChatRequest, model: str, stream: bool = True,
                   cache_control: bool = False) -> dict:
    """POST /v1/messages body. With ``cache_control`` the system prompt (and the tool list)
    carry an ephemeral breakpoint, as a client using prompt caching would send."""
    system: str | list[dict] = req.system
    tools = [dict(t) for t in req.tools]
    if cache_control:
        system = [{"type": "text", "text": req.system, "cache_control": {"type": "ephemeral"}}]
        if tools:
            tools[-1]["cache_control"] = {"type": "ephemeral"}
    body = {"model": model, "max_tokens": req.max_tokens, "system": system,
            "messages": list(req.messages), "temperature": 0.0, "stream": stream}
    if tools:
        body["tools"] = tools
    return body


def _openai_tool(tool: dict) -> dict:
    return {"type": "function", "function": {"name": tool["name"],
                                             "description": tool["description"],
                                             "parameters": tool["input_schema"]}}


def _openai_messages(message: dict) -> list[dict]:
    """One Anthropic message as OpenAI messages (tool_use -> tool_calls, tool_result -> tool)."""
    content = message["content"]
    if isinstance(content, str):
        return [{"role": message["role"], "content": content}]
    texts = [b["text"] for b in content if b["type"] == "text"]
    calls = [{"id": b["id"], "type": "function",
              "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
             for b in content if b["type"] == "tool_use"]
    results = [{"role": "tool", "tool_call_id": b["tool_use_id"], "content": b["content"]}
               for b in content if b["type"] == "tool_result"]
    out = []
    if texts or calls:
        out.append({"role": message["role"], "content": "\n".join(texts) or None})
        if calls:
            out[-1]["tool_calls"] = calls
    return out + results


def openai_body(req: ChatRequest, model: str, stream: bool = True) -> dict:
    """POST /v1/chat/completions body (streaming with usage in the last chunk)."""
    messages = [{"role": "system", "content": req.system}]
    for message in req.messages:
        messages += _openai_messages(message)
    body = {"model": model, "max_tokens": req.max_tokens, "messages": messages,
            "temperature": 0.0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if req.tools:
        body["tools"] = [_openai_tool(t) for t in req.tools]
    return body
