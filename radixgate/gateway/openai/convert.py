"""OpenAI chat request -> ConvertedPrompt, rendered exactly like the Anthropic equivalent.

Leading system/developer messages form the system part (after the tools section); later
ones stay system messages in place. Assistant ``tool_calls`` and ``tool`` messages become
the same text as Anthropic tool_use / tool_result blocks (consecutive tool messages share
one user turn). ``cache_control`` on a text part is a breakpoint.
"""
from __future__ import annotations

import json

from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.prompt_parts import (BreakpointRules, ConvertedPrompt,
                                            check_unique_tool_names, tool_pieces)
from radixgate.gateway.render import ChatMessage, Conversation, Piece
from radixgate.gateway.openai.schemas import ChatCompletionRequest, ChatMessageIn, TextPart
from radixgate.gateway.constraints import auto_tool_constraint, tool_calls
from radixgate.gateway.constraint_fields import openai_constraint
from radixgate.gateway.tools import ToolSpec, forced_call_prefill, tool_call_text, tool_result_text


def convert_chat_request(req: ChatCompletionRequest) -> ConvertedPrompt:
    rules = BreakpointRules()
    tools = req.tools or []
    names = [t.function.name for t in tools]
    check_unique_tool_names(names)
    specs = [ToolSpec(t.function.name, t.function.description, t.function.parameters)
             for t in tools]
    system = tool_pieces([(spec, None) for spec in specs], rules)
    leading = 0
    while leading < len(req.messages) and req.messages[leading].role in ("system", "developer"):
        system += _pieces(req.messages[leading], leading, rules)
        leading += 1
    messages = _messages(req.messages, leading, rules)
    if not messages:
        raise ApiError(Kind.BAD_REQUEST, "messages: at least one non-system message is required",
                       param="messages")
    parsed, prefix = _tool_choice(req, names)
    prefill = (Piece(prefix),) if prefix else ()
    named = _forced_name(req.tool_choice) if prefix else None
    # a named function is "call exactly one specific function": one call, never parallel
    parallel = req.parallel_tool_calls is not False and named is None
    strict = {t.function.name for t in tools if t.function.strict}
    if prefix:
        found = tool_calls("tool_choice", specs, named, parallel)
    else:
        found = auto_tool_constraint(openai_constraint(req), specs if parsed else [],
                                     strict if parsed else set(), parallel)
    return ConvertedPrompt(Conversation(tuple(system), tuple(messages), prefill),
                           tuple(parsed), prefix, found, None if parallel else 1)


def _forced_name(choice) -> str | None:
    """The named function of a forced tool_choice (None: "required", any tool)."""
    return None if choice == "required" else choice.function.name


def _messages(items: list[ChatMessageIn], start: int, rules: BreakpointRules
              ) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    pending_results: list[Piece] = []
    for i in range(start, len(items)):
        message = items[i]
        if message.role == "tool":
            pending_results.append(_tool_result(message, i))
            continue
        if pending_results:
            out.append(ChatMessage("user", tuple(pending_results)))
            pending_results = []
        role = "system" if message.role == "developer" else message.role
        out.append(ChatMessage(role, tuple(_pieces(message, i, rules))))
    if pending_results:
        out.append(ChatMessage("user", tuple(pending_results)))
    return out


def _pieces(message: ChatMessageIn, index: int, rules: BreakpointRules) -> list[Piece]:
    pieces: list[Piece] = []
    content = message.content
    if isinstance(content, str):
        pieces.append(Piece(content))
    elif content is not None:
        for j, part in enumerate(content):
            where = f"messages[{index}].content[{j}]"
            if not isinstance(part, TextPart):
                raise ApiError(Kind.BAD_REQUEST, f"{where}: content part type '{part.type}' is "
                               "not supported: this model reads text only", param=where)
            ttl = part.cache_control.ttl if part.cache_control else None
            pieces.append(Piece(part.text, rules.add(ttl, part.text, where) if ttl else None))
    for j, call in enumerate(message.tool_calls or []):
        pieces.append(Piece(tool_call_text(call.id, call.function.name,
                                           _arguments(call.function.arguments, index, j))))
    if not pieces:
        pieces.append(Piece(""))
    return pieces


def _arguments(raw: str, index: int, j: int) -> dict:
    where = f"messages[{index}].tool_calls[{j}].function.arguments"
    try:
        value = json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise ApiError(Kind.BAD_REQUEST, f"{where} is not valid JSON", param=where) from None
    if not isinstance(value, dict):
        raise ApiError(Kind.BAD_REQUEST, f"{where} must be a JSON object", param=where)
    return value


def _tool_result(message: ChatMessageIn, index: int) -> Piece:
    if not message.tool_call_id:
        raise ApiError(Kind.BAD_REQUEST, f"messages[{index}].tool_call_id is required for "
                       "tool messages", param=f"messages[{index}].tool_call_id")
    content = message.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, TextPart):
                where = f"messages[{index}].content[{j}]"
                raise ApiError(Kind.BAD_REQUEST, f"{where}: content part type '{part.type}' "
                               "is not supported in tool messages", param=where)
            texts.append(part.text)
        text = "\n".join(texts)
    return Piece(tool_result_text(message.tool_call_id, text))


def _tool_choice(req: ChatCompletionRequest, names: list[str]) -> tuple[list[str], str]:
    choice = req.tool_choice
    if choice is None or choice == "auto":
        return names, ""
    if choice == "none":
        return [], ""
    if not names:
        raise ApiError(Kind.BAD_REQUEST, "tool_choice is only allowed when tools are specified",
                       param="tool_choice")
    if choice == "required":
        return names, forced_call_prefill(None)
    if choice.function.name not in names:
        raise ApiError(Kind.BAD_REQUEST, f"tool_choice: function {choice.function.name!r} is "
                       "not in tools", param="tool_choice")
    return names, forced_call_prefill(choice.function.name)
