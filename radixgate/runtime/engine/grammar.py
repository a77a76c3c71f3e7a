"""Grammars for constrained decoding, on llguidance: building, compiling, per-request state.

A grammar is llguidance's Lark dialect (``start: ...``), which embeds JSON schemas
(``%json {...}``), regular expressions (``/.../``) and string literals; the builders below
make those pieces. ``GrammarCompiler.compile`` validates a grammar against this model's
vocabulary (the tokenizer's own ``tokenizer.json``; no download) and returns a
``CompiledGrammar``, a template whose ``matcher()`` is one request's ``RequestGrammar``.

Work is bounded by llguidance's own fuel limits (``LIMITS``): building the lexer and each
next-token mask stop with an error when they run out; a grammar that runs out while
compiling, names an unknown rule or a JSON-schema keyword llguidance does not implement,
or whose next-token mask (after the lexer is built) costs over ``MAX_MASK_S`` of CPU time,
raises ``GrammarError`` (a 400 at the API; ``GrammarTooSlow`` for the cost, never cached).

JSON is generated compactly with the prompt format's separators (``", "`` and ``": "``) and
no other whitespace, so a model can never loop on spaces or newlines. A JSON schema's objects
are closed where it does not say ``additionalProperties`` (``closed_objects``), as vLLM's
default backend reads schemas, so a model cannot invent properties until ``max_tokens``;
``open_objects`` keeps the plain JSON Schema reading (the server's
``[server] json_schema_open_objects``).

Why llguidance (``python -m benchmarks.grammar_engines``): compile of a tool schema ~0.3 ms
(xgrammar ~4 ms), per-token masks of a few microseconds for both, 7.5 MB installed with no
dependency (xgrammar adds transformers and tvm-ffi, ~140 MB), forced tokens
(``compute_ff_tokens``) for jump-forward, and fuel limits that really stop work.
"""
from __future__ import annotations

import json
import threading
import time
from functools import cached_property

import llguidance

JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_GRAMMAR_BYTES = 256 * 1024   # a grammar's text (schemas included)
MAX_REGEX_CHARS = 4096
MAX_MASK_S = 0.02         # a grammar whose next-token mask costs more is refused
LIMITS = {"initial_lexer_fuel": 1_000_000, "step_lexer_fuel": 200_000, "step_max_items": 50_000,
          "max_lexer_states": 100_000, "max_grammar_size": 200_000}


class GrammarError(ValueError):
    """The grammar cannot be used; the message names the problem (answered with a 400)."""


class GrammarTooSlow(GrammarError):
    """The grammar's masks cost more than ``MAX_MASK_S``: a verdict from a measurement,
    which callers must not cache (another try may pass)."""


# -- building blocks of the Lark text ------------------------------------------------------

def lark_literal(text: str) -> str:
    """A Lark string literal matching ``text`` exactly."""
    return json.dumps(text, ensure_ascii=False)


def lark_json(schema: dict | bool, open_objects: bool = False) -> str:
    """A ``%json`` rule body for ``schema`` in the compact format (``JSON_FORMAT``), its
    objects closed (``closed_objects``) unless ``open_objects``."""
    if schema is True or schema == {}:
        schema = {}
    elif not isinstance(schema, dict):
        raise GrammarError("a JSON schema must be an object")
    if not open_objects:
        schema = closed_objects(schema)
    body = {**schema, "x-guidance": {**schema.get("x-guidance", {}), **JSON_FORMAT}}
    return "%json " + json.dumps(body, ensure_ascii=False)


# keywords whose value is a schema, a list of schemas, or a name -> schema map
_SUBSCHEMA = ("additionalProperties", "items", "contains", "not", "if", "then", "else",
              "unevaluatedItems", "propertyNames")
_SUBSCHEMA_LISTS = ("items", "prefixItems", "anyOf", "oneOf")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                   "dependentSchemas")


def closed_objects(schema, close: bool = True):
    """``schema`` read as vLLM's default grammar backend (xgrammar) reads it: an object
    schema that lists ``properties`` and says neither ``additionalProperties`` nor
    ``unevaluatedProperties`` gets ``additionalProperties: false``, at every depth (nested
    properties, array items, ``$defs``, ``anyOf`` / ``oneOf`` branches, ...). An object
    listing no properties stays open (any object). The branches of an ``allOf`` are not
    closed themselves (each would refuse the others' properties), their subschemas are.
    Returns a new schema; the input is not changed."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(s) for s in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(s) for name, s in out[key].items()}
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [closed_objects(s, close=False) for s in out["allOf"]]
    if (close and isinstance(out.get("properties"), dict) and "additionalProperties" not in out
            and "unevaluatedProperties" not in out and "allOf" not in out):
        out["additionalProperties"] = False
    return out


def lark_regex(regex: str) -> str:
    """A Lark regex token for ``regex`` (Python / Rust regex syntax, whole-output match)."""
    if len(regex) > MAX_REGEX_CHARS:
        raise GrammarError(f"the regex is {len(regex)} characters long; at most "
                           f"{MAX_REGEX_CHARS} are allowed")
    return "/" + llguidance.regex_to_lark(regex, "") + "/"


def json_grammar(schema: dict | bool, open_objects: bool = False) -> str:
    return "start: " + lark_json(schema, open_objects)


def regex_grammar(regex: str) -> str:
    return "start: " + lark_regex(regex)


def choice_grammar(choices: list[str]) -> str:
    if not choices or not all(isinstance(c, str) for c in choices):
        raise GrammarError("choice must be a non-empty list of strings")
    return "start: " + " | ".join(lark_literal(c) for c in choices)


# -- compiling ----------------------------------------------------------------------------

class RequestGrammar:
    """One request's grammar state (the engine thread, and its mask worker while a forward
    pass runs, use it in turn; never two threads at once)."""

    __slots__ = ("matcher",)

    def __init__(self, matcher):
        self.matcher = matcher

    def fill_mask(self, pointer: int, num_bytes: int) -> None:
        """Writes the next-token bitmask (bit t of 32-bit word t // 32: token t allowed)."""
        self.matcher.unsafe_compute_mask_ptr(pointer, num_bytes)

    def consume(self, token: int) -> bool:
        return self.matcher.consume_token(token)

    def forced_tokens(self) -> list[int]:
        """Tokens the grammar allows as the only continuation (may be empty)."""
        return self.matcher.compute_ff_tokens()

    @property
    def only_end(self) -> bool:
        """The grammar is complete and allows nothing but the end."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None


def mask_pool(threads: int):
    """llguidance's thread pool for batched mask fills."""
    return llguidance.LLExecutor(threads)


def fill_masks_batched(pool, grammars: list[RequestGrammar], pointer: int,
                       mask_bytes: int) -> None:
    """Writes grammars[i]'s next-token bitmask at ``pointer + i * mask_bytes``, the rows
    shared out over ``pool``'s threads (llguidance releases the interpreter lock)."""
    pool.unsafe_compute_mask_ptr([(g.matcher, i) for i, g in enumerate(grammars)], pointer,
                                 mask_bytes, len(grammars))


class CompiledGrammar:
    """A validated grammar: ``matcher()`` gives a fresh per-request state (thread-safe)."""

    def __init__(self, template, source: str):
        self._template = template
        self._lock = threading.Lock()
        self.source = source

    def matcher(self) -> RequestGrammar:
        with self._lock:
            return RequestGrammar(self._template.deep_copy())


class GrammarCompiler:
    """Compiles grammars against one model's vocabulary (``vocab_size``: the logits' width,
    which may exceed the tokenizer's). Thread-safe; building the llguidance tokenizer takes
    ~0.2 s and happens at the first compile."""

    def __init__(self, tokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._lock = threading.Lock()

    @cached_property
    def ll_tokenizer(self):
        return llguidance.LLTokenizer(self._tokenizer.backend.to_str(), n_vocab=self.vocab_size,
                                      eos_token=sorted(self._tokenizer.eos_token_ids))

    def compile(self, source: str) -> CompiledGrammar:
        """Raises ``GrammarError`` naming the problem."""
        if len(source.encode()) > MAX_GRAMMAR_BYTES:
            raise GrammarError(f"the grammar or schema is too large (at most "
                               f"{MAX_GRAMMAR_BYTES // 1024} KiB)")
        with self._lock:
            tokenizer = self.ll_tokenizer
        limits = llguidance.LLParserLimits(**LIMITS, verbose_errors=False)
        matcher = llguidance.LLMatcher(tokenizer, source, log_level=0, limits=limits)
        if matcher.is_error():
            raise GrammarError(_first_line(matcher.get_error()))
        self._probe(matcher)
        return CompiledGrammar(matcher, source)

    @staticmethod
    def _probe(matcher) -> None:
        """Computes the first mask on a copy (it builds the lexer states; its errors are the
        grammar's), then times what every step would pay. Some grammars (nested
        repetitions) stay within llguidance's fuel yet cost far more than a step should:
        over ``MAX_MASK_S`` they are refused (``GrammarTooSlow``), since masks run on the
        engine's step. The cost is this thread's CPU time, not wall time (a busy machine
        or a preempted thread does not make a grammar "complex"), the least of up to
        ``MASK_TRIES`` tries."""
        probe = matcher.deep_copy()
        probe.compute_bitmask()
        if probe.is_error() or matcher.is_error():
            raise GrammarError(_first_line(probe.get_error() or matcher.get_error()))
        cost = mask_cpu_seconds(probe)
        if cost > MAX_MASK_S:
            raise GrammarTooSlow(f"the grammar is too complex: one next-token mask takes "
                                 f"{1e3 * cost:.0f} ms (at most {1e3 * MAX_MASK_S:.0f} ms)")


MASK_TRIES = 3


def mask_cpu_seconds(matcher) -> float:
    """The least CPU time (this thread's: llguidance computes a lone mask on the calling
    thread) of up to ``MASK_TRIES`` next-token masks; stops at the first under
    ``MAX_MASK_S``."""
    best = float("inf")
    for _ in range(MASK_TRIES):
        started = time.thread_time()
        matcher.compute_bitmask()
        best = min(best, time.thread_time() - started)
        if best <= MAX_MASK_S:
            break
    return best


def _first_line(message: str) -> str:
    """llguidance's message without its source excerpt (which may echo the grammar)."""
    line = message.strip().splitlines()[0] if message.strip() else "invalid grammar"
    return line.split(": ", 1)[1] if line.startswith("at ") and ": " in line else line
