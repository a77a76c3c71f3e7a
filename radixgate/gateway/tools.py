"""Tool definitions, tool calls and tool results as prompt text, and tool calls in output.

The fixed formats (documented in docs/PROMPT_FORMAT.md) for templates without tool support:

- definitions (system part, before system text): ``TOOLS_HEADER`` then one piece per tool,
  ``<tool>{"name": ..., "description": ..., "input_schema": {...}}</tool>`` (keys in this
  order, the schema as the client sent it, so a definition renders the same every time);
- a call the assistant made: ``<tool_call>{"id": ..., "name": ..., "arguments": {...}}</tool_call>``;
- a result: ``<tool_result id="ID">text</tool_result>`` (``error="true"`` when is_error);
- model output: every ``<tool_call>{json}</tool_call>`` whose JSON has a declared ``name``
  and an object ``arguments`` (or ``input``) becomes a tool call. The JSON's end is found
  by its structure, never by the first closing tag; markup that is not a valid call is
  dropped, so the format never reaches a client (``ToolCallParser``).
"""
from __future__ import annotations

import json
import re
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


@dataclass(frozen=True, slots=True)
class PartialCall:
    """A call the output stopped inside: ``arguments_text`` is its arguments' JSON so far."""

    id: str
    name: str
    arguments_text: str


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
    """The call in one call's JSON text, or None when it is not a valid call."""
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


_PARTIAL_HEAD = re.compile(r'\s*\{\s*(?:"id"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*)?'
                           r'"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|input)"\s*:\s*',
                           re.DOTALL)


def parse_partial_call(body: str, allowed: Iterable[str], id_prefix: str) -> PartialCall | None:
    """The call an output ends inside (``body``: its JSON text so far), when its name is
    complete and declared: the arguments are the JSON text after ``"arguments": ``."""
    head = _PARTIAL_HEAD.match(body)
    if head is None:
        return None
    name = json.loads(head.group(1))
    if name not in set(allowed):
        return None
    return PartialCall(new_call_id(id_prefix), name, body[head.end():])


_JSON_OUTSIDE_STRINGS = frozenset(' \t\n\r{}[],:-+.0123456789eEtrufalsn"')


class JsonEnd:
    """Finds where the JSON value at the start of a growing text ends, following its
    strings, escapes and nesting (a ``</tool_call>`` inside a string is string content).
    ``find(text)`` scans only what it has not seen (``text`` must grow by appending) and
    returns the end's index once the outermost object or array is closed, or the index of
    the first character that no JSON has there (outside strings), ``broken`` then set;
    else None. It checks structure only: the caller validates the value (``json.loads``)."""

    __slots__ = ("_pos", "_depth", "_in_string", "_escaped", "_end", "broken")

    def __init__(self):
        self._pos, self._depth, self._in_string, self._escaped = 0, 0, False, False
        self._end: int | None = None
        self.broken = False

    def find(self, text: str) -> int | None:
        for i in range(self._pos, len(text) if self._end is None else 0):
            ch = text[i]
            if not self._in_string and ch not in _JSON_OUTSIDE_STRINGS:
                self._end, self.broken = i, True
            elif self._step(ch):
                self._end = i + 1
            if self._end is not None:
                break
        self._pos = len(text)
        return self._end

    def _step(self, ch: str) -> bool:
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif ch == "\\":
                self._escaped = True
            elif ch == '"':
                self._in_string = False
            return False
        if ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            return self._depth <= 0
        return False


class ToolCallParser:
    """Splits streamed output text into text pieces and tool calls.

    ``feed(text)`` and ``finish()`` return ``("text", str)`` and ``("tool", ToolCall)`` items
    in output order, and at the very end ``("partial", PartialCall)`` when the output stops
    inside a call whose name is known (cut by ``max_tokens`` or a stop sequence).

    A call is ``<tool_call>``, a JSON object, then ``</tool_call>``: the object's end is found
    by following its structure (``JsonEnd``), so the format's markers inside a JSON string
    stay in the string. The format never reaches the text: a call that is not valid (bad
    JSON, an undeclared name) is dropped, and so are stray ``</tool_call>`` markers and a
    ``<tool_call>`` not followed by an object. A complete object whose closing tag is
    missing still counts. Text that might be the start of a marker is held back until it is
    decided. Whitespace-only text after a tool call is dropped (it would otherwise become
    an empty text block). ``max_calls``: valid calls beyond this many are dropped
    (parallel calls disabled).
    """

    def __init__(self, allowed_names: Iterable[str], id_prefix: str,
                 max_calls: int | None = None):
        self._allowed = frozenset(allowed_names)
        self._id_prefix = id_prefix
        self._max_calls = max_calls
        self._buffer = ""          # text not decided yet; inside a call: the call's body
        self._call: JsonEnd | None = None    # set: inside a call, after <tool_call>
        self._pending_space = ""
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[tuple[str, object]]:
        self._buffer += text
        out: list[tuple[str, object]] = []
        while self._step(out):
            pass
        return out

    def finish(self) -> list[tuple[str, object]]:
        """Releases held text (less a marker cut at the very end); a call whose object is
        complete counts without its closing tag, one cut inside its object is the
        ``partial`` item (or nothing, when its name is not complete yet)."""
        out: list[tuple[str, object]] = []
        if self._call is not None:
            self._finish_call(out)
        else:                      # less a marker cut at the very end
            self._emit_text(out, self._buffer[:len(self._buffer) - _held_marker(self._buffer)])
        self._buffer = self._pending_space = ""
        self._call = None
        return out

    def _step(self, out: list) -> bool:
        """Decides what it can at the front of the buffer; False: wait for more text."""
        if self._call is not None:
            return self._step_in_call(out)
        start, marker = _first_marker(self._buffer)
        if start < 0:
            keep = _held_marker(self._buffer)
            self._emit_text(out, self._buffer[:len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return False
        self._emit_text(out, self._buffer[:start])
        self._buffer = self._buffer[start + len(marker):]
        if marker == CALL_OPEN:
            self._call = JsonEnd()
        return True

    def _step_in_call(self, out: list) -> bool:
        body = self._buffer.lstrip()
        if not body:
            return False
        if body[0] != "{":         # not a call: the marker goes, the rest is text
            self._call = None
            return True
        end = self._call.find(self._buffer)
        if end is None:
            return False
        if self._call.broken:      # not JSON: what was read goes, the rest is read again
            self._call = None
            self._buffer = self._buffer[end:]
            return True
        after = self._buffer[end:].lstrip()
        if CALL_CLOSE.startswith(after) and len(after) < len(CALL_CLOSE):
            return False           # the closing tag may follow
        self._end_call(out, self._buffer[:end])
        rest = self._buffer[end:]
        self._buffer = after[len(CALL_CLOSE):] if after.startswith(CALL_CLOSE) else rest
        return True

    def _finish_call(self, out: list) -> None:
        end = self._call.find(self._buffer)
        if end is not None:
            self._end_call(out, self._buffer[:end])
            self._emit_text(out, _without_partial_close(self._buffer[end:]))
            return
        partial = parse_partial_call(self._buffer, self._allowed, self._id_prefix)
        if partial is not None:
            out.append(("partial", partial))

    def _end_call(self, out: list, body: str) -> None:
        self._call = None
        call = parse_call(body, self._allowed, self._id_prefix)
        if call is None:
            return
        if self._max_calls is not None and len(self.calls) >= self._max_calls:
            return
        self.calls.append(call)
        self._pending_space = ""
        out.append(("tool", call))

    def _emit_text(self, out: list, text: str) -> None:
        if not text:
            return
        if self.calls and not text.strip():   # maybe only the gap between two calls
            self._pending_space += text
            return
        out.append(("text", self._pending_space + text))
        self._pending_space = ""


def _first_marker(text: str) -> tuple[int, str]:
    """(index, marker) of the first ``<tool_call>`` or ``</tool_call>`` in text; (-1, "")."""
    found = [(i, m) for m in (CALL_OPEN, CALL_CLOSE) if (i := text.find(m)) >= 0]
    return min(found) if found else (-1, "")


def _without_partial_close(text: str) -> str:
    """``text`` less a cut ``</tool_call>`` after a call's object (the output ended there)."""
    stripped = text.lstrip()
    return "" if CALL_CLOSE.startswith(stripped) else text


def _held_marker(text: str) -> int:
    """Length of the end of ``text`` that may be the start of a marker."""
    return max(_partial_suffix(text, marker) for marker in (CALL_OPEN, CALL_CLOSE))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def split_output(text: str, allowed_names: Iterable[str], id_prefix: str,
                 max_calls: int | None = None) -> list[tuple[str, object]]:
    """Whole-output version of ToolCallParser: merged text pieces, tool calls and the
    final partial call, if any."""
    parser = ToolCallParser(allowed_names, id_prefix, max_calls)
    items = parser.feed(text) + parser.finish()
    merged: list[tuple[str, object]] = []
    for kind, value in items:
        if kind == "text" and merged and merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + value)
        else:
            merged.append((kind, value))
    return merged
