"""Anthropic Messages request -> ConvertedPrompt (tools -> system -> messages).

Each content block becomes one ``Piece``; its ``cache_control`` becomes the piece's
breakpoint TTL. A top-level ``cache_control`` marks the last block of the last message. A
final assistant message is a prefill: the model continues it.
"""
from __future__ import annotations

from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.prompt_parts import (BreakpointRules, ConvertedPrompt,
                                            check_unique_tool_names, tool_pieces)
from radixgate.gateway.render import ChatMessage, Conversation, Piece
from radixgate.gateway.anthropic.schemas import (CacheControl, InputMessage, TextBlock,
                                                 ToolResultBlock, ToolUseBlock,
                                                 UnsupportedBlock, PromptFields)
from radixgate.gateway.constraints import auto_tool_constraint, tool_calls
from radixgate.gateway.constraint_fields import anthropic_constraint
from radixgate.gateway.tools import ToolSpec, forced_call_prefill, tool_call_text, tool_result_text


def convert_messages_request(req: PromptFields) -> ConvertedPrompt:
    if req.thinking is not None and req.thinking.type != "disabled":
        raise ApiError(Kind.BAD_REQUEST, "thinking: extended thinking is not supported by this "
                       'model; omit it or send {"type": "disabled"}', param="thinking")
    rules = BreakpointRules()
    tools = req.tools or []
    check_unique_tool_names([t.name for t in tools])
    specs = [ToolSpec(t.name, t.description, t.input_schema) for t in tools]
    system = tool_pieces([(spec, _ttl(t.cache_control)) for spec, t in zip(specs, tools)], rules)
    system += _system_pieces(req.system, rules)
    check_tool_results(req.messages)
    messages = [_message(m, i, rules) for i, m in enumerate(req.messages)]
    if req.cache_control is not None:
        messages = _mark_last_block(messages, req.cache_control, rules)
    prefill: tuple[Piece, ...] = ()
    if req.messages[-1].role == "assistant":
        prefill = messages.pop().pieces
        if prefill and prefill[-1].text != prefill[-1].text.rstrip():
            raise ApiError(Kind.BAD_REQUEST,
                           "final assistant content cannot end with trailing whitespace",
                           param=f"messages.{len(req.messages) - 1}")
    names, output_prefix = _tool_choice(req, [t.name for t in tools])
    if output_prefix:
        prefill = prefill + (Piece(output_prefix),)
    if not messages and not system:
        raise ApiError(Kind.BAD_REQUEST, "messages: the first message must use the user role",
                       param="messages")
    choice = req.tool_choice
    parallel = not (choice is not None and choice.disable_parallel_tool_use)
    forced = (tool_calls("tool_choice", specs, choice.name if choice.type == "tool" else None,
                         parallel) if output_prefix else None)
    strict = {t.name for t in tools if t.strict}
    auto = (None if output_prefix else auto_tool_constraint(
        anthropic_constraint(req), specs if names else [], strict if names else set(), parallel))
    return ConvertedPrompt(Conversation(tuple(system), tuple(messages), prefill),
                           tuple(names), output_prefix, forced or auto, None if parallel else 1)


def check_tool_results(messages: list[InputMessage]) -> None:
    """Each ``tool_result`` answers a ``tool_use`` with its id in an earlier message; one
    that does not is a 400, as Anthropic answers it (the model would read a result of a
    call it never made)."""
    called: set[str] = set()
    for i, message in enumerate(messages):
        for j, block in enumerate(message.content if isinstance(message.content, list) else ()):
            if isinstance(block, ToolUseBlock):
                called.add(block.id)
            elif isinstance(block, ToolResultBlock) and block.tool_use_id not in called:
                where = f"messages.{i}.content.{j}"
                raise ApiError(Kind.BAD_REQUEST, f"{where}: unexpected `tool_use_id` found in "
                               f"`tool_result` blocks: {block.tool_use_id}. Each `tool_result` "
                               "block must have a corresponding `tool_use` block in an earlier "
                               "message.", param=where)


def _ttl(cache_control: CacheControl | None) -> str | None:
    return cache_control.ttl if cache_control is not None else None


def _system_pieces(system: str | list[TextBlock] | None, rules: BreakpointRules) -> list[Piece]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [Piece(system)]
    pieces = []
    for i, block in enumerate(system):
        ttl = _ttl(block.cache_control)
        ttl_s = rules.add(ttl, block.text, f"system.{i}") if ttl else None
        pieces.append(Piece(block.text, ttl_s))
    return pieces


def _message(message: InputMessage, index: int, rules: BreakpointRules) -> ChatMessage:
    if isinstance(message.content, str):
        return ChatMessage(message.role, (Piece(message.content),))
    if not message.content:
        raise ApiError(Kind.BAD_REQUEST, f"messages.{index}: content must not be empty",
                       param=f"messages.{index}.content")
    pieces = []
    for j, block in enumerate(message.content):
        where = f"messages.{index}.content.{j}"
        text = _block_text(block, where)
        ttl = _ttl(block.cache_control)
        pieces.append(Piece(text, rules.add(ttl, text, where) if ttl else None))
    return ChatMessage(message.role, tuple(pieces))


def _block_text(block, where: str) -> str:
    if isinstance(block, TextBlock):
        return block.text
    if isinstance(block, ToolUseBlock):
        return tool_call_text(block.id, block.name, block.input)
    if isinstance(block, ToolResultBlock):
        return tool_result_text(block.tool_use_id, _result_text(block, where), block.is_error)
    assert isinstance(block, UnsupportedBlock)
    raise ApiError(Kind.BAD_REQUEST,
                   f"{where}: content type '{block.type}' is not supported: this model reads "
                   "text only (text, tool_use and tool_result blocks)", param=where)


def _result_text(block: ToolResultBlock, where: str) -> str:
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    parts = []
    for k, inner in enumerate(block.content):
        if isinstance(inner, UnsupportedBlock):
            raise ApiError(Kind.BAD_REQUEST, f"{where}.content.{k}: content type "
                           f"'{inner.type}' is not supported in tool results", param=where)
        parts.append(inner.text)
    return "\n".join(parts)


def _mark_last_block(messages: list[ChatMessage], cache_control: CacheControl,
                     rules: BreakpointRules) -> list[ChatMessage]:
    """Top-level cache_control: a breakpoint on the last block of the last message."""
    last = messages[-1]
    pieces = list(last.pieces)
    if pieces[-1].ttl_s is None:
        where = f"messages.{len(messages) - 1}.content.{len(pieces) - 1}"
        pieces[-1] = Piece(pieces[-1].text, rules.add(cache_control.ttl, pieces[-1].text, where))
    return [*messages[:-1], ChatMessage(last.role, tuple(pieces))]


def _tool_choice(req: PromptFields, names: list[str]) -> tuple[list[str], str]:
    """(tool names whose calls are parsed from the output, forced-call prefill text)."""
    choice = req.tool_choice
    if choice is None or choice.type == "auto":
        return names, ""
    if not names and choice.type != "none":
        raise ApiError(Kind.BAD_REQUEST, "tool_choice may only be specified while providing "
                       "tools", param="tool_choice")
    if choice.type == "none":
        return [], ""
    if choice.type == "any":
        return names, forced_call_prefill(None)
    if choice.name not in names:
        raise ApiError(Kind.BAD_REQUEST, f"tool_choice.name: tool {choice.name!r} is not in "
                       "tools", param="tool_choice.name")
    return names, forced_call_prefill(choice.name)
