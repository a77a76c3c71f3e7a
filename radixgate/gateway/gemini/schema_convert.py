"""Gemini's ``Schema`` (an OpenAPI 3 subset: ``"type": "OBJECT"``, ``nullable``, ...) as the
JSON Schema the grammar compiler and the tool definitions read."""
from __future__ import annotations

from typing import Any

_KEEP = ("description", "enum", "format", "minimum", "maximum", "minLength", "maxLength",
         "pattern", "minItems", "maxItems", "required", "title", "default", "minProperties",
         "maxProperties")


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with lower-case types, ``nullable`` as a null alternative, and its
    ``properties`` / ``items`` / ``anyOf`` converted in turn (``propertyOrdering`` dropped).
    An object with properties has those only (Gemini's Schema has no other kind)."""
    out: dict[str, Any] = {key: schema[key] for key in _KEEP if key in schema}
    kind = schema.get("type")
    if isinstance(kind, str) and kind.upper() != "TYPE_UNSPECIFIED":
        out["type"] = kind.lower()
    if "properties" in schema:
        out["properties"] = {k: json_schema(v) for k, v in schema["properties"].items()}
        out["additionalProperties"] = False
    if "items" in schema:
        out["items"] = json_schema(schema["items"])
    if "anyOf" in schema:
        out["anyOf"] = [json_schema(s) for s in schema["anyOf"]]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out
