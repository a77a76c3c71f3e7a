"""A Gemini request (and the explicit cache it names) -> ConvertedPrompt.

``systemInstruction`` and the tools section form the system part; ``contents`` the turns
(``model`` is the assistant, ``function`` a user turn). A ``functionCall`` part becomes the
same text as Anthropic's tool_use, a ``functionResponse`` part a tool result (its id: the
part's own, or the earliest call of that name still unanswered). A cached content is its own
system part, tools and turns, then the request's turns; a breakpoint on its last piece keeps
it pinned for the cache's remaining time. ``toolConfig.functionCallingConfig.mode``: AUTO
(the default), ANY (a call is forced; one allowed name forces that tool), NONE (no calls
parsed), VALIDATED (calls match their schemas). ``responseMimeType: application/json`` with
``responseJsonSchema`` or ``responseSchema`` constrains the answer to the schema (to any JSON
object without one), ``text/x.enum`` to the schema's enum.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from radixgate.gateway.constraints import (Constraint, auto_tool_constraint, choice,
                                           json_object, json_schema, tool_calls)
from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.gemini.schema_convert import json_schema as to_json_schema
from radixgate.gateway.gemini.schemas import (Content, PromptFields,
                                              Tool, ToolConfig)
from radixgate.gateway.prompt_parts import (BreakpointRules, ConvertedPrompt,
                                            check_unique_tool_names, tool_pieces)
from radixgate.gateway.render import ChatMessage, Conversation, Piece
from radixgate.gateway.tools import ToolSpec, forced_call_prefill, tool_call_text, tool_result_text

ROLES = {"user": "user", "model": "assistant", "function": "user", None: "user"}


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """An explicit cache's prompt and how long its pin should last from now."""

    fields: PromptFields
    ttl_s: float


def convert_prompt(fields: PromptFields, generation=None,
                   cached: CachedPrefix | None = None) -> ConvertedPrompt:
    """``fields`` (a request) -> ConvertedPrompt; with ``cached``, the cache's prompt comes
    first (a breakpoint at its end) and ``fields`` adds turns only (a cache being created:
    empty ``fields``)."""
    source = cached.fields if cached is not None else fields
    specs = tool_specs(source.tools)
    system = tool_pieces([(spec, None) for spec in specs], BreakpointRules())
    system += system_pieces(source.system_instruction)
    ids = _CallIds()
    turns = [_turn(c, f"contents.{i}", ids) for i, c in enumerate(source.contents)]
    if cached is not None:
        system, turns = _mark_end(system, turns, cached.ttl_s)
        turns += [_turn(c, f"contents.{i}", ids) for i, c in enumerate(fields.contents)]
    if not turns and not system:
        raise ApiError(Kind.BAD_REQUEST, "contents is not specified", param="contents")
    return _with_tools(Conversation(tuple(system), tuple(turns)), specs, source.tool_config,
                       answer_format(generation))


def tool_specs(tools: list[Tool] | None) -> list[ToolSpec]:
    specs = []
    for i, tool in enumerate(tools or []):
        for name in ("google_search", "google_search_retrieval", "code_execution",
                     "url_context"):
            if getattr(tool, name) is not None:
                raise ApiError(Kind.BAD_REQUEST, f"tools.{i}: {name} is not supported by this "
                               "server (function declarations only)", param=f"tools.{i}")
        for decl in tool.function_declarations or []:
            schema = decl.parameters_json_schema if decl.parameters_json_schema is not None \
                else to_json_schema(decl.parameters) if decl.parameters else {"type": "object"}
            specs.append(ToolSpec(decl.name, decl.description, schema))
    check_unique_tool_names([s.name for s in specs], "tools")
    return specs


def system_pieces(system: Content | str | None) -> list[Piece]:
    if system is None:
        return []
    if isinstance(system, str):
        return [Piece(system)] if system else []
    return [Piece(p.text) for p in system.parts if p.text]


def _mark_end(system: list[Piece], turns: list[ChatMessage], ttl_s: float):
    """A breakpoint (``ttl_s``) on the cached prompt's last piece."""
    if turns:
        last = turns[-1]
        pieces = list(last.pieces)
        pieces[-1] = Piece(pieces[-1].text, ttl_s)
        return system, [*turns[:-1], ChatMessage(last.role, tuple(pieces))]
    return [*system[:-1], Piece(system[-1].text, ttl_s)], turns


class _CallIds:
    """Ids for function calls that carry none, and the call each response answers."""

    def __init__(self):
        self.count = 0
        self.pending: list[tuple[str, str]] = []      # (name, id) not answered yet

    def call(self, name: str, given: str | None) -> str:
        self.count += 1
        call_id = given or f"call_{self.count}"
        self.pending.append((name, call_id))
        return call_id

    def response(self, name: str, given: str | None) -> str:
        for k, (pending_name, call_id) in enumerate(self.pending):
            if (given and call_id == given) or (not given and pending_name == name):
                del self.pending[k]
                return call_id
        return given or f"call_{name}"


def _turn(content: Content, where: str, ids: _CallIds) -> ChatMessage:
    pieces = []
    for j, part in enumerate(content.parts):
        kind = part.unsupported()
        if kind is not None:
            raise ApiError(Kind.BAD_REQUEST, f"{where}.parts.{j}: {kind} is not supported: "
                           "this model reads text only", param=f"{where}.parts.{j}")
        if part.thought:
            continue
        if part.function_call is not None:
            call = part.function_call
            pieces.append(Piece(tool_call_text(ids.call(call.name, call.id), call.name,
                                               call.args)))
        elif part.function_response is not None:
            answer = part.function_response
            pieces.append(Piece(tool_result_text(ids.response(answer.name, answer.id),
                                                 json.dumps(answer.response, ensure_ascii=False))))
        elif part.text is not None:
            pieces.append(Piece(part.text))
    if not pieces:
        raise ApiError(Kind.BAD_REQUEST, f"{where}: content must have at least one part",
                       param=f"{where}.parts")
    return ChatMessage(ROLES[content.role], tuple(pieces))


def answer_format(generation) -> Constraint | None:
    """The answer's constraint from ``generationConfig``'s response fields."""
    if generation is None:
        return None
    mime = generation.response_mime_type or "text/plain"
    schema = generation.response_json_schema
    if schema is None and generation.response_schema is not None:
        schema = to_json_schema(generation.response_schema)
    if mime == "application/json":
        if schema is None:
            return json_object("generationConfig.responseMimeType")
        return json_schema("generationConfig.responseSchema", schema)
    if mime == "text/x.enum":
        values = (schema or {}).get("enum")
        if not values:
            raise ApiError(Kind.BAD_REQUEST, "generationConfig.responseSchema: text/x.enum "
                           "needs a schema with an enum", param="generationConfig.responseSchema")
        return choice("generationConfig.responseSchema", [str(v) for v in values])
    if mime != "text/plain":
        raise ApiError(Kind.BAD_REQUEST, f"generationConfig.responseMimeType: {mime!r} is not "
                       "supported (text/plain, application/json, text/x.enum)",
                       param="generationConfig.responseMimeType")
    if schema is not None:
        raise ApiError(Kind.BAD_REQUEST, "generationConfig.responseSchema needs responseMimeType "
                       "application/json or text/x.enum", param="generationConfig.responseSchema")
    return None


def _with_tools(conversation: Conversation, specs: list[ToolSpec], config: ToolConfig | None,
                fmt: Constraint | None) -> ConvertedPrompt:
    calling = config.function_calling_config if config is not None else None
    mode = (calling.mode if calling is not None else "AUTO").replace("MODE_UNSPECIFIED", "AUTO")
    names = [s.name for s in specs]
    if mode == "NONE" or not specs:
        if mode == "ANY":
            raise ApiError(Kind.BAD_REQUEST, "toolConfig: mode ANY needs function declarations",
                           param="toolConfig")
        return ConvertedPrompt(conversation, (), "", fmt)
    allowed = list(calling.allowed_function_names or []) if calling is not None else []
    unknown = [n for n in allowed if n not in names]
    if unknown:
        raise ApiError(Kind.BAD_REQUEST, f"toolConfig: allowed function {unknown[0]!r} is not "
                       "declared", param="toolConfig.functionCallingConfig.allowedFunctionNames")
    callable_specs = [s for s in specs if not allowed or s.name in allowed]
    if mode == "ANY":
        forced = allowed[0] if len(allowed) == 1 else None
        prefix = forced_call_prefill(forced)
        conversation = Conversation(conversation.system, conversation.messages, (Piece(prefix),))
        return ConvertedPrompt(conversation, tuple(names), prefix,
                               tool_calls("toolConfig", callable_specs, forced, True))
    strict = set(names) if mode == "VALIDATED" else set()
    return ConvertedPrompt(conversation, tuple(names), "",
                           auto_tool_constraint(fmt, callable_specs, strict, True))
