"""Each API's structured-output fields -> one ``constraints.Constraint`` (or None: free).

- OpenAI chat / completions: ``response_format`` (``json_schema`` with name, schema,
  strict; ``json_object``; ``text``); vLLM's ``structured_outputs`` (``json``, ``regex``,
  ``choice``, ``grammar``, ``json_object``) and its older ``guided_json`` /
  ``guided_regex`` / ``guided_choice`` / ``guided_grammar``. At most one of them may be
  given (a 400 otherwise).
- Anthropic: ``output_config.format`` ``{type: "json_schema", schema}`` and the earlier
  beta ``output_format`` of the same shape.
- Responses: ``text.format`` ``{type: "json_schema", name, schema, strict}`` or
  ``{type: "json_object"}``, read as the chat request's ``response_format``
  (``openai/responses/convert.py``).

An unknown key inside ``response_format``, ``structured_outputs`` or ``text.format`` is a
400 naming it (their schema models forbid extras); an empty ``structured_outputs`` too.
A forced tool call's grammar (``tool_choice``) is made by the converters and wins over
these fields; under ``tool_choice`` auto the format and the tools combine
(``constraints.format_or_calls``).
"""
from __future__ import annotations

from radixgate.gateway import constraints
from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.constraints import Constraint


def openai_constraint(body) -> Constraint | None:
    """From an OpenAI chat or completions body (fields it lacks count as absent)."""
    found = [c for c in (_response_format(getattr(body, "response_format", None)),
                         *_vllm(body)) if c is not None]
    if len(found) > 1:
        names = ", ".join(c.param for c in found)
        raise ApiError(Kind.BAD_REQUEST, f"only one structured-output field may be given; "
                       f"got {names}", param=found[1].param)
    return found[0] if found else None


def _response_format(fmt) -> Constraint | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return constraints.json_object("response_format")
    if fmt.json_schema is None:
        raise ApiError(Kind.BAD_REQUEST, "response_format.json_schema is required when type "
                       "is 'json_schema'", param="response_format.json_schema")
    return constraints.json_schema("response_format.json_schema.schema", fmt.json_schema.schema_)


def _vllm(body) -> list[Constraint | None]:
    out: list[Constraint | None] = []
    outputs = getattr(body, "structured_outputs", None)
    if outputs is not None:
        given = _vllm_fields("structured_outputs.", outputs.json_, outputs.regex,
                             outputs.choice, outputs.grammar, outputs.json_object)
        if not given:
            raise ApiError(Kind.BAD_REQUEST, "structured_outputs: give one of json, regex, "
                           "choice, grammar or json_object", param="structured_outputs")
        out += given
    out += _vllm_fields("guided_", getattr(body, "guided_json", None),
                        getattr(body, "guided_regex", None), getattr(body, "guided_choice", None),
                        getattr(body, "guided_grammar", None), None)
    return out


def _vllm_fields(prefix: str, json_, regex, choice, grammar, json_object) -> list[Constraint]:
    out = []
    if json_ is not None:
        out.append(constraints.json_schema(prefix + "json", {} if json_ is True else json_))
    if regex is not None:
        out.append(constraints.regex(prefix + "regex", regex))
    if choice is not None:
        out.append(constraints.choice(prefix + "choice", choice))
    if grammar is not None:
        out.append(constraints.lark(prefix + "grammar", grammar))
    if json_object:
        out.append(constraints.json_object(prefix + "json_object"))
    return out


def anthropic_constraint(body) -> Constraint | None:
    """``output_config.format`` or the beta ``output_format`` (not both)."""
    config = getattr(body, "output_config", None)
    formats = [("output_config.format", config.format if config is not None else None),
               ("output_format", getattr(body, "output_format", None))]
    given = [(param, fmt) for param, fmt in formats if fmt is not None]
    if len(given) > 1:
        raise ApiError(Kind.BAD_REQUEST, "give output_config.format or output_format, not both",
                       param="output_format")
    if not given:
        return None
    param, fmt = given[0]
    return constraints.json_schema(param + ".schema", fmt.schema_)

