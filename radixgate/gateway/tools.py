"""Tool definitions, tool calls and tool results as prompt text, and tool calls in output.

The fixed formats (documented in docs/PROMPT_FORMAT.md) for templates without tool support:

- definitions (system part, before system text): ``TOOLS_HEADER`` then one piece per tool,
  ``<tool>{"name": ..., "description": ..., "input_schema": {...}}</tool>`` (keys in this
  order, the schema as the client sent it, so a definition renders the same every time);
- a call the assistant made: ``<tool_call>{"id": ..., "name": ..., "arguments": {...}}</tool_call>``;
- a result: ``<tool_result id="ID">text</tool_result>`` (``error="true"`` when is_error);
- model output: every ``<tool_call>{json}</tool_call>`` whose JSON has a declared ``name``
  and an object ``arguments`` (or ``input``) becomes a tool call; anything else stays text.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Iterable

TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call one or more of the functions below. To call a function, reply with\n"
    '<tool_call>{"name": <function-name>, "arguments": <arguments-json-object>}</tool_call>\n'
    "and nothing after the last call. Function results come back as\n"
    '<tool_result id="...">...</tool_result>.\n\n'
    "Available functions (JSON schema of each function's arguments):")
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str | None
    input_schema: dict


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: dict


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def tool_definition_text(tool: ToolSpec) -> str:
    body: dict = {"name": tool.name}
    if tool.description:
        body["description"] = tool.description
    body["input_schema"] = tool.input_schema
    return f"<tool>{_dumps(body)}</tool>"


def tool_call_text(call_id: str, name: str, arguments: dict) -> str:
    return f"{CALL_OPEN}{_dumps({'id': call_id, 'name': name, 'arguments': arguments})}{CALL_CLOSE}"


def tool_result_text(tool_use_id: str, content: str, is_error: bool = False) -> str:
    error = ' error="true"' if is_error else ""
    return f'<tool_result id="{_escape_attr(tool_use_id)}"{error}>{content}</tool_result>'


def forced_call_prefill(name: str | None) -> str:
    """Assistant-turn prefix that makes the model call ``name`` (or any tool when None)."""
    if name is None:
        return CALL_OPEN + '{"name": "'
    return CALL_OPEN + '{"name": ' + json.dumps(name) + ', "arguments": '


def _escape_attr(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")


def new_call_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def parse_call(body: str, allowed: Iterable[str], id_prefix: str) -> ToolCall | None:
    """The call inside one ``<tool_call>...</tool_call>``, or None when it is not a valid call."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("name") not in set(allowed):
        return None
    arguments = data.get("arguments", data.get("input", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(new_call_id(id_prefix), data["name"], arguments)


class ToolCallParser:
    """Splits streamed output text into text pieces and tool calls.

    ``feed(text)`` and ``finish()`` return ``("text", str)`` and ``("tool", ToolCall)`` items
    in output order. Text that might be the start of ``<tool_call>`` is held back until it
    is decided; an unterminated or invalid call is released as text. Whitespace-only text
    after a tool call is dropped (it would otherwise become an empty text block).
    ``max_calls``: valid calls beyond this many are dropped (parallel calls disabled).
    """

    def __init__(self, allowed_names: Iterable[str], id_prefix: str,
                 max_calls: int | None = None):
        self._allowed = frozenset(allowed_names)
        self._id_prefix = id_prefix
        self._max_calls = max_calls
        self._buffer = ""
        self._pending_space = ""
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[tuple[str, object]]:
        self._buffer += text
        out: list[tuple[str, object]] = []
        while True:
            start = self._buffer.find(CALL_OPEN)
            if start < 0:
                keep = _partial_suffix(self._buffer, CALL_OPEN)
                self._emit_text(out, self._buffer[:len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep:]
                return out
            end = self._buffer.find(CALL_CLOSE, start)
            if end < 0:
                self._emit_text(out, self._buffer[:start])
                self._buffer = self._buffer[start:]
                return out
            self._emit_text(out, self._buffer[:start])
            raw = self._buffer[start:end + len(CALL_CLOSE)]
            call = parse_call(self._buffer[start + len(CALL_OPEN):end], self._allowed,
                              self._id_prefix)
            if call is None:
                self._emit_text(out, raw)
            elif self._room_for_call():
                self.calls.append(call)
                self._pending_space = ""
                out.append(("tool", call))
            self._buffer = self._buffer[end + len(CALL_CLOSE):]

    def finish(self) -> list[tuple[str, object]]:
        """Releases held text. An unterminated call at the very end still counts when its
        JSON is complete and only whitespace follows (small models often stop right there)."""
        out: list[tuple[str, object]] = []
        call = self._unterminated_call()
        if call is not None and not self._room_for_call():
            self._buffer = ""
        elif call is not None:
            self.calls.append(call)
            self._pending_space = ""
            self._buffer = ""
            out.append(("tool", call))
        self._emit_text(out, self._buffer)
        self._buffer = ""
        self._pending_space = ""
        return out

    def _room_for_call(self) -> bool:
        return self._max_calls is None or len(self.calls) < self._max_calls

    def _unterminated_call(self) -> ToolCall | None:
        if not self._buffer.startswith(CALL_OPEN):
            return None
        body = self._buffer[len(CALL_OPEN):].lstrip()
        try:
            _, end = json.JSONDecoder().raw_decode(body)
        except ValueError:
            return None
        if body[end:].strip():
            return None
        return parse_call(body[:end], self._allowed, self._id_prefix)

    def _emit_text(self, out: list, text: str) -> None:
        if not text:
            return
        if self.calls and not text.strip():   # maybe only the gap between two calls
            self._pending_space += text
            return
        out.append(("text", self._pending_space + text))
        self._pending_space = ""


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split_output(text: str, allowed_names: Iterable[str], id_prefix: str,
                 max_calls: int | None = None) -> list[tuple[str, object]]:
    """Whole-output version of ToolCallParser: merged text pieces and tool calls."""
    parser = ToolCallParser(allowed_names, id_prefix, max_calls)
    items = parser.feed(text) + parser.finish()
    merged: list[tuple[str, object]] = []
    for kind, value in items:
        if kind == "text" and merged and merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + value)
        else:
            merged.append((kind, value))
    return merged
