"""Pydantic validation errors as the client wrote the body: field paths, not schema names.

Pydantic names the branch of a union it tried in the error's location
(``messages.0.content.list[tagged-union[TextBlock,...]].1.text.text``, ``system.str``).
``user_errors`` walks each location along the model's core schema and keeps only the
segments the client wrote (field names, list indexes, dict keys): union branch labels and
discriminator tags are dropped, so that error reads ``messages.0.content.1.text``. A union
that failed on every branch reports each branch; only the branches that got deepest into
the body are kept, and the messages at one location are joined ("a valid string or a
valid list").
"""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

_WRAPPERS = ("model", "default", "nullable", "function-after", "function-before",
             "function-wrap", "function-plain", "lax-or-strict", "json-or-python", "chain")
_SEQUENCES = ("list", "tuple", "set", "frozenset")
# messages that name Python types (or a model class) in JSON's words
_JSON_WORDS = {"model_type": "Input should be an object",
               "dict_type": "Input should be an object"}


@dataclass(frozen=True, slots=True)
class UserError:
    path: str        # "messages.0.content.1.text"; "" for the body itself
    message: str


def user_errors(error: ValidationError, model: type[BaseModel] | None = None) -> list[UserError]:
    """``error``'s errors at the client's field paths (see the module docstring); without
    ``model`` the locations are kept as pydantic wrote them."""
    root = model.__pydantic_core_schema__ if model is not None else None
    found = [UserError(".".join(map(str, _client_loc(root, item["loc"]))),
                       _JSON_WORDS.get(item["type"], item["msg"]))
             for item in error.errors(include_url=False)]
    deepest = [e for e in found if not any(_below(other.path, e.path) for other in found)]
    return _joined(deepest)


def _below(path: str, parent: str) -> bool:
    return path != parent and (not parent or path.startswith(parent + "."))


def _joined(errors: list[UserError]) -> list[UserError]:
    """One error per path, its distinct messages joined with "or", in first-seen order."""
    by_path: dict[str, list[str]] = {}
    for e in errors:
        messages = by_path.setdefault(e.path, [])
        if e.message not in messages:
            messages.append(e.message)
    return [UserError(path, " or ".join(_shortened(messages))) for path, messages in
            by_path.items()]


def _shortened(messages: list[str]) -> list[str]:
    """"Input should be a valid string", "Input should be a valid list" -> "... or a valid
    list": a repeated opening is said once."""
    lead = "Input should be "
    if len(messages) < 2 or not all(m.startswith(lead) for m in messages):
        return messages
    return [messages[0]] + [m.removeprefix(lead) for m in messages[1:]]


def _client_loc(root: dict | None, loc: tuple) -> list:
    """``loc`` without the segments pydantic adds for union branches and tags."""
    if root is None:
        return list(loc)
    definitions = {d["ref"]: d for d in root.get("definitions", ())}
    candidates = [root]
    kept = []
    for segment in loc:
        candidates = _structural(candidates, definitions)
        unions = [s for s in candidates if s["type"] in ("union", "tagged-union")]
        if unions:                  # the segment names a branch: not the client's
            candidates = [c for u in unions for c in _branches(u, segment)]
            continue
        kept.append(segment)
        candidates = [c for s in candidates for c in _child(s, segment)]
    return kept


def _structural(schemas: list[dict], definitions: dict) -> list[dict]:
    """Each schema with its wrappers (defaults, nullables, validators, refs) unwrapped."""
    out = []
    for schema in schemas:
        for _ in range(64):
            kind = schema["type"]
            if kind == "definitions":
                definitions.update({d["ref"]: d for d in schema["definitions"]})
                schema = schema["schema"]
            elif kind == "definition-ref":
                schema = definitions.get(schema["schema_ref"], {"type": "any"})
            elif kind in _WRAPPERS and "schema" in schema:
                schema = schema["schema"] if kind != "chain" else schema["steps"][-1]
            else:
                break
        out.append(schema)
    return out


def _branches(union: dict, segment) -> list[dict]:
    if union["type"] == "tagged-union":
        choices = union["choices"]
        return [choices[segment]] if segment in choices else list(choices.values())
    return [c[0] if isinstance(c, tuple) else c for c in union["choices"]]


def _child(schema: dict, segment) -> list[dict]:
    """The schema below ``schema`` at one location segment the client wrote."""
    kind = schema["type"]
    if kind == "model-fields":
        for name, field in schema["fields"].items():
            if segment in (name, field.get("validation_alias")):
                return [field["schema"]]
        return []
    if kind in _SEQUENCES and isinstance(segment, int):
        items = schema.get("items_schema")
        return [items] if isinstance(items, dict) else []
    if kind == "dict":
        values = schema.get("values_schema")
        return [values] if values else []
    return []
