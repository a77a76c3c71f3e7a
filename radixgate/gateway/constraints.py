"""Structured output and forced tool calls at the API edge.

Each API's request fields become one ``Constraint`` (a grammar in llguidance's Lark dialect,
``radixgate/runtime/engine/grammar.py``, and the parameter it came from), compiled before the request is
queued: a bad schema, an unsupported keyword or a regex too large is a 400 naming the
parameter and the problem. Compiled grammars are cached per (tenant, grammar), so a
tenant's repeated schema compiles once and no tenant's entries answer another's requests.

A client's JSON schema is read as vLLM's default grammar backend reads it: an object that
does not say ``additionalProperties`` gets no property it does not list
(``grammar.closed_objects``). Each Constraint carries that grammar and, where it differs,
the plain reading (``open_source``), which the server's ``[server]
json_schema_open_objects`` picks at compile time.

Forced tool calls keep the prompt format of docs/PROMPT_FORMAT.md: the assistant turn is
prefilled (``tools.forced_call_prefill``) and the grammar covers the rest of the call, so
``tools.ToolCallParser`` reads a call whose arguments match that tool's schema::

    <tool_call>{"name": "NAME", "arguments": {...}}</tool_call>

further calls (parallel ones) follow after a newline, and nothing else; a forced call to
one named function is exactly one call on OpenAI's APIs (the converters pass
``parallel=False``). Strict tools under ``tool_choice`` auto get free text (that never
contains ``<tool_call>``) or text followed by such calls; an answer format (``response_format``)
with tools under auto gets the formatted answer or calls alone (``format_or_calls``).
"""
from __future__ import annotations

import asyncio
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.tools import CALL_CLOSE, CALL_OPEN, ToolSpec

if TYPE_CHECKING:
    from radixgate.runtime.engine.grammar import CompiledGrammar, GrammarCompiler, GrammarError

CACHE_ENTRIES = 512        # compiled grammars kept (all tenants together), least recent out
COMPILE_TIMEOUT_S = 10.0   # a compile still running then is answered with a 400


@dataclass(frozen=True, slots=True)
class Constraint:
    """``source``: the grammar; ``param``: the request field it came from (for errors);
    ``open_source``: the same grammar with its JSON schemas read plainly (an object that
    does not say ``additionalProperties`` open), served under the server's
    ``[server] json_schema_open_objects``; None where it is ``source`` (no schema inside)."""

    source: str
    param: str
    open_source: str | None = None

    def for_objects(self, open_objects: bool) -> str:
        """The grammar to compile under the server's setting."""
        return self.open_source if open_objects and self.open_source else self.source


def grammars() -> ModuleType:
    """radixgate/runtime/engine/grammar.py, imported at the first constrained request: it loads
    llguidance, which a server that never sees a constraint never needs
    (tests/test_structured_api.py checks that importing the app does not load it)."""
    from radixgate.runtime.engine import grammar
    return grammar


def constraint(param: str, build, *args) -> Constraint:
    """``build(grammars())(*args)`` as a Constraint (``build`` picks the builder from the
    grammar module); a GrammarError becomes a 400 naming ``param``."""
    g = grammars()
    try:
        return Constraint(build(g)(*args), param)
    except g.GrammarError as exc:
        raise ApiError(Kind.BAD_REQUEST, f"{param}: {exc}", param=param) from None


def schema_constraint(param: str, build, *args) -> Constraint:
    """``constraint`` for a builder with JSON schemas inside: ``build(grammars())(*args,
    open_objects)`` both ways (objects closed where a schema does not say
    ``additionalProperties``, as vLLM's default backend reads schemas; and open)."""
    g = grammars()
    try:
        closed, open_ = build(g)(*args, False), build(g)(*args, True)
    except g.GrammarError as exc:
        raise ApiError(Kind.BAD_REQUEST, f"{param}: {exc}", param=param) from None
    return Constraint(closed, param, open_ if open_ != closed else None)


def json_schema(param: str, schema) -> Constraint:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise ApiError(Kind.BAD_REQUEST, f"{param}: the schema is not valid JSON",
                           param=param) from None
    return schema_constraint(param, lambda g: g.json_grammar, schema)


def json_object(param: str) -> Constraint:
    return constraint(param, lambda g: g.json_grammar, {"type": "object"})


def regex(param: str, pattern: str) -> Constraint:
    return constraint(param, lambda g: g.regex_grammar, pattern)


def choice(param: str, choices: list[str]) -> Constraint:
    return constraint(param, lambda g: g.choice_grammar, choices)


def lark(param: str, text: str) -> Constraint:
    """A client's own grammar: llguidance's Lark, or GBNF (``::=`` rules), converted."""
    if "::=" in text:
        from llguidance.gbnf_to_lark import gbnf_to_lark
        try:
            text = gbnf_to_lark(text)
        except Exception as exc:  # noqa: BLE001 - the converter's own parse errors
            raise ApiError(Kind.BAD_REQUEST, f"{param}: invalid GBNF grammar: {exc}",
                           param=param) from None
    return Constraint(text, param)


# -- forced tool calls ---------------------------------------------------------------------

def tool_calls(param: str, tools: list[ToolSpec], forced: str | None,
               parallel: bool) -> Constraint:
    """The grammar of the text after ``forced_call_prefill(forced)``: the rest of one call
    (to ``forced``, or to any of ``tools`` when None), then, when ``parallel``, more calls
    (to the same tool when one is forced), each after a newline."""
    return schema_constraint(param, lambda g: _forced_calls_source, tools, forced, parallel)


def strict_tool_calls(param: str, tools: list[ToolSpec], strict: set[str],
                      parallel: bool) -> Constraint:
    """``tool_choice`` auto with strict tools: free text (without ``<tool_call>``), or text
    then calls; a strict tool's arguments match its schema, another's are any object."""
    return schema_constraint(param, lambda g: _auto_calls_source, tools, strict, parallel)


def format_or_calls(fmt: Constraint, tools: list[ToolSpec], strict: set[str],
                    parallel: bool) -> Constraint:
    """``tool_choice`` auto with an answer format (``response_format``, ...): the answer is
    either in that format or tool calls alone (no text before them: any text would be
    outside the format), as OpenAI does. Arguments as in ``strict_tool_calls``. The format's
    grammar is embedded whole (``@answer``), so any format combines."""
    closed = _format_or_calls_source(fmt.source, tools, strict, parallel, False)
    open_ = _format_or_calls_source(fmt.for_objects(True), tools, strict, parallel, True)
    return Constraint(closed, fmt.param, open_ if open_ != closed else None)


def auto_tool_constraint(fmt: Constraint | None, tools: list[ToolSpec], strict: set[str],
                         parallel: bool) -> Constraint | None:
    """What constrains an answer under ``tool_choice`` auto: the format or calls, strict
    tools' calls or free text, the format alone when no tool is callable, or nothing."""
    if fmt is not None and tools:
        return format_or_calls(fmt, tools, strict, parallel)
    if fmt is None and strict:
        return strict_tool_calls("tools", tools, strict, parallel)
    return fmt


def _literal(text: str) -> str:
    return grammars().lark_literal(text)


def _lark_json(schema: dict | bool, open_objects: bool) -> str:
    return grammars().lark_json(schema, open_objects)


NAME_OPEN = CALL_OPEN + '{"name": "'     # what forced_call_prefill(None) prefills
FREE_TEXT = "/(?s:.*)/ & ~/(?s:.*" + CALL_OPEN + ".*)/"


def _forced_calls_source(tools: list[ToolSpec], forced: str | None, parallel: bool,
                         open_objects: bool) -> str:
    callable_ = [t for t in tools if forced is None or t.name == forced]
    first = "args_0 close" if forced is not None else "named"
    return "\n".join([f"start: {first}{_more_calls(parallel)}",
                      *_call_rules(callable_, {t.name for t in callable_}, open_objects)])


def _auto_calls_source(tools: list[ToolSpec], strict: set[str], parallel: bool,
                       open_objects: bool) -> str:
    return "\n".join([
        f"start: FREE | text {_literal(NAME_OPEN[len(CALL_OPEN):])} named"
        f"{_more_calls(parallel)}",
        f"FREE: {FREE_TEXT}", f"text[suffix={_literal(CALL_OPEN)}]: /(?s:.*)/",
        *_call_rules(tools, strict, open_objects)])


def _format_or_calls_source(answer: str, tools: list[ToolSpec], strict: set[str],
                            parallel: bool, open_objects: bool) -> str:
    main = "\n".join([f"start: @answer | {_literal(NAME_OPEN)} named{_more_calls(parallel)}",
                      *_call_rules(tools, strict, open_objects)])
    return json.dumps({"grammars": [{"lark_grammar": main},
                                    {"name": "answer", "lark_grammar": answer}]})


def _more_calls(parallel: bool) -> str:
    return f" ({_literal(chr(10) + NAME_OPEN)} named)*" if parallel else ""


def _call_rules(tools: list[ToolSpec], strict: set[str], open_objects: bool) -> list[str]:
    """``named``: the rest of a call after NAME_OPEN, to one of ``tools``; arguments match
    the schema of the tools in ``strict``, any JSON object for the others."""
    after_name = '", "arguments": '
    rules = [f"tool_{i}: {_literal(t.name + after_name)} args_{i} close"
             for i, t in enumerate(tools)]
    schemas = [t.input_schema if t.name in strict else {"type": "object"} for t in tools]
    rules += [f"args_{i}: {_lark_json(schema, open_objects)}" for i, schema in enumerate(schemas)]
    return ["named: " + " | ".join(f"tool_{i}" for i in range(len(tools))),
            f"close: {_literal('}' + CALL_CLOSE)}", *rules]


# -- compiling, cached per tenant ----------------------------------------------------------

class GrammarCache:
    """Compiled grammars (and compile errors) per (tenant, source); thread-safe."""

    def __init__(self, compiler: GrammarCompiler, max_entries: int = CACHE_ENTRIES):
        self.compiler = compiler
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], CompiledGrammar | GrammarError] = OrderedDict()
        self._grammar = grammars()
        self._lock = threading.Lock()
        self.compiles = 0

    def get(self, tenant: str, source: str) -> CompiledGrammar:
        """The compiled grammar; raises GrammarError (also for a cached failure). A
        ``GrammarTooSlow`` verdict is a measurement, not the grammar's: never cached."""
        key = (tenant, source)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
        if found is None:
            found = self._compile(source)
            if not isinstance(found, self._grammar.GrammarTooSlow):
                with self._lock:
                    self._entries[key] = found
                    while len(self._entries) > self.max_entries:
                        self._entries.popitem(last=False)
        if isinstance(found, self._grammar.GrammarError):
            raise found
        return found

    def _compile(self, source: str) -> CompiledGrammar | GrammarError:
        self.compiles += 1
        try:
            return self.compiler.compile(source)
        except self._grammar.GrammarError as exc:
            return exc


_cache_lock = threading.Lock()


def grammar_cache(state) -> GrammarCache:
    """The state's cache, made at the first constrained request (its compiler builds the
    vocabulary's llguidance tokenizer, ~0.2 s, at the first compile)."""
    with _cache_lock:
        if state.grammars is None:
            engine = state.require_engine()
            compiler = grammars().GrammarCompiler(engine.tokenizer, engine.model_info.vocab_size)
            state.grammars = GrammarCache(compiler)
        return state.grammars


async def compile_constraint(state, tenant: str, found: Constraint | None
                             ) -> CompiledGrammar | None:
    """The compiled grammar of ``found`` (None: unconstrained), in a worker thread; a 400
    naming the parameter when it cannot be used or compiling outlasts COMPILE_TIMEOUT_S."""
    if found is None:
        return None
    cache = grammar_cache(state)
    source = found.for_objects(state.config.server.json_schema_open_objects)
    try:
        return await asyncio.wait_for(asyncio.to_thread(cache.get, tenant, source),
                                      COMPILE_TIMEOUT_S)
    except grammars().GrammarError as exc:
        raise ApiError(Kind.BAD_REQUEST, f"{found.param}: {exc}", param=found.param) from None
    except asyncio.TimeoutError:
        raise ApiError(Kind.BAD_REQUEST, f"{found.param}: the grammar took more than "
                       f"{COMPILE_TIMEOUT_S:.0f} s to compile", param=found.param) from None
