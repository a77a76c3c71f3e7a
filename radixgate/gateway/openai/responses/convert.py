"""OpenAI Responses request -> the equivalent chat conversation -> prompt token ids.

A first turn is rewritten as the chat completions request it means (``instructions`` a
leading system message, message items chat messages, ``function_call`` items assistant
``tool_calls``, ``function_call_output`` items ``tool`` messages, flat function tools
nested under ``function``) and converted by ``openai/convert.py``, so both APIs render the
same prompt (docs/PROMPT_FORMAT.md), forced tool choices included.

A turn with ``previous_response_id`` continues from the stored turn's token ids (its
prompt and its output as generated), not from re-rendered text, so all of its KV is
reused: ``render_continuation`` appends the template's end of the assistant turn, the new
items' messages (tokenized in segments, exactly as ``render_prompt`` cuts them) and the
generation prompt. The stored system part stays: a continuation's ``instructions`` and
``tools`` may be omitted or repeated, a different value is a 400.
"""
from __future__ import annotations

import dataclasses
import json
from array import array
from dataclasses import dataclass
from typing import Sequence

from pydantic import ValidationError

from radixgate.gateway.openai.convert import convert_chat_request
from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.http_util import validation_message
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.render import ChatMessage, Conversation
from radixgate.gateway.openai.responses.store import StoredTurn
from radixgate.gateway.openai.schemas import ChatCompletionRequest
from radixgate.gateway.openai.responses.schemas import (FunctionCallItem, FunctionCallOutputItem,
                                                 FunctionTool, MessageItem,
                                                 NamedFunctionChoice, ResponsesRequest,
                                                 InputTextPart)


@dataclass(frozen=True, slots=True)
class ResponsesTurn:
    """A converted turn: ``converted`` is what to render (for a continuation: only the new
    messages, system part empty) and how to read the output; ``roles`` are the template
    roles of every prompt message of this turn, history included (stored for the next)."""

    converted: ConvertedPrompt
    roles: tuple[str, ...]
    instructions: str | None
    tools: tuple[dict, ...]


def chat_tools(body: ResponsesRequest) -> tuple[dict, ...]:
    """The request's function tools in the chat completions shape (other types: 400)."""
    tools = []
    for i, tool in enumerate(body.tools or []):
        if not isinstance(tool, FunctionTool):
            raise ApiError(Kind.BAD_REQUEST, f"tools[{i}]: tool type '{tool.type}' is not "
                           "supported: only function tools", param=f"tools[{i}].type")
        function = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.parameters is not None:
            function["parameters"] = tool.parameters
        tools.append({"type": "function", "function": function})
    return tuple(tools)


def convert_first_turn(body: ResponsesRequest) -> ResponsesTurn:
    tools = chat_tools(body)
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    converted = _convert(body, system + chat_messages(body), tools)
    roles = tuple(m.role for m in converted.conversation.template_messages())
    return ResponsesTurn(converted, roles, body.instructions, tools)


def convert_continuation(body: ResponsesRequest, stored: StoredTurn) -> ResponsesTurn:
    """The new items as messages that follow the stored turn's answer."""
    if body.instructions is not None and body.instructions != stored.instructions:
        raise ApiError(Kind.BAD_REQUEST, "instructions must be omitted or the same as the "
                       "previous response's: a continuation keeps the stored prompt",
                       param="instructions")
    tools = chat_tools(body) if body.tools is not None else stored.tools
    if tools != stored.tools:
        raise ApiError(Kind.BAD_REQUEST, "tools must be omitted or the same as the previous "
                       "response's: a continuation keeps the stored prompt", param="tools")
    converted = _convert(body, chat_messages(body), tools)
    conversation = converted.conversation
    leading = conversation.system[1 + len(tools) if tools else 0:]   # after the tools section
    messages = ((ChatMessage("system", leading),) if leading else ()) + conversation.messages
    converted = dataclasses.replace(converted, conversation=Conversation(
        (), messages, conversation.prefill))
    roles = stored.roles + ("assistant",) + tuple(m.role for m in messages)
    return ResponsesTurn(converted, roles, stored.instructions, tools)


def _response_format(fmt) -> dict:
    """``text.format`` as the chat request's ``response_format``."""
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    schema = {"schema": fmt.schema_ if fmt.schema_ is not None else {}}
    if fmt.name:
        schema["name"] = fmt.name
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": schema}


def _convert(body: ResponsesRequest, messages: list[dict], tools: tuple[dict, ...]
             ) -> ConvertedPrompt:
    if all(m["role"] in ("system", "developer") for m in messages):
        raise ApiError(Kind.BAD_REQUEST, "input: at least one item that is not a system or "
                       "developer message is required", param="input")
    chat: dict = {"messages": messages}
    if tools:
        chat["tools"] = list(tools)
    if isinstance(body.tool_choice, NamedFunctionChoice):
        chat["tool_choice"] = {"type": "function", "function": {"name": body.tool_choice.name}}
    elif body.tool_choice is not None:
        chat["tool_choice"] = body.tool_choice
    if body.parallel_tool_calls is not None:
        chat["parallel_tool_calls"] = body.parallel_tool_calls
    if body.text is not None and body.text.format is not None:
        chat["response_format"] = _response_format(body.text.format)
    try:
        request = ChatCompletionRequest.model_validate(chat)
    except ValidationError as e:
        raise ApiError(Kind.BAD_REQUEST, validation_message(e, ChatCompletionRequest)) from None
    converted = convert_chat_request(request)
    found = converted.constraint
    if found is not None and found.param.startswith("response_format"):   # name our field
        converted = dataclasses.replace(converted, constraint=dataclasses.replace(
            found, param="text.format"))
    return converted


def chat_messages(body: ResponsesRequest) -> list[dict]:
    """``input`` as chat messages: consecutive assistant text and function calls share one
    assistant message (their chat form)."""
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    out: list[dict] = []
    for i, item in enumerate(body.input):
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": _text(item.content, f"input[{i}].content")})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id,
                        "content": _text(item.output, f"input[{i}].output")})
        else:
            raise ApiError(Kind.BAD_REQUEST, f"input[{i}]: item type '{item.type}' is not "
                           "supported (message, function_call and function_call_output are)",
                           param=f"input[{i}].type")
    return out


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, InputTextPart):
            raise ApiError(Kind.BAD_REQUEST, f"{where}[{j}]: content part type '{part.type}' "
                           "is not supported: this model reads text only",
                           param=f"{where}[{j}].type")
        texts.append(part.text)
    return "\n".join(texts)


def continuation_base(stored: StoredTurn, eos_ids: set[int]) -> list[int]:
    """The stored turn's ids the continuation starts with: an answer that ended in an EOS
    token loses it (the template's end-of-turn text follows instead; for ChatML templates
    that is the same ``<|im_end|>`` id). The engine never computed the KV of the last
    output token (it was sampled, not fed back), so at most that one token is recomputed."""
    tokens = list(stored.tokens)
    if tokens and tokens[-1] in eos_ids:
        tokens.pop()
    return tokens


def stored_tokens(prompt: Sequence[int], output: Sequence[int]) -> array:
    """prompt + output ids, compactly (4 bytes a token)."""
    tokens = array("i", prompt)
    tokens.extend(output)
    return tokens


def tools_body(tools: tuple[dict, ...]) -> list[dict]:
    """The response's ``tools`` echo, in the Responses shape."""
    out = []
    for tool in tools:
        function = tool["function"]
        out.append({"type": "function", "name": function["name"],
                    "description": function.get("description"),
                    "parameters": function.get("parameters"), "strict": None})
    return out


def arguments_json(arguments: dict) -> str:
    return json.dumps(arguments, ensure_ascii=False)
