"""Pydantic models of the OpenAI Responses request (POST /v1/responses, HTTP edge).

``input`` is a string (one user message) or a list of items: messages (``type`` may be
omitted, roles user / assistant / system / developer, content a string or ``input_text`` /
``output_text`` parts), ``function_call`` and ``function_call_output``. Tools are the flat
Responses shape ``{"type": "function", "name", "description", "parameters"}``. Image, file
and audio parts, other item and tool types, reasoning settings,
``background`` and ``truncation: "auto"`` are refused with a 400 naming the field (the
handler's checks or validation); other unknown top-level fields are ignored and named in
``x-radixgate-ignored-fields``. ``text.format`` json_schema / json_object constrain the answer
(radixgate/gateway/constraints.py).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class InputTextPart(_Model):
    """``input_text`` (user, system, developer) or ``output_text`` (an earlier assistant
    turn); annotations and logprobs of an output_text are ignored."""

    type: Literal["input_text", "output_text"]
    text: str


class UnsupportedInputPart(_Model):
    type: str


def _type_of(value: Any, default: str | None = None) -> str | None:
    """The ``type`` a discriminator routes on (None when it is not a string: the
    "other" model then refuses it in validation)."""
    kind = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) else None


def _part_kind(value: Any) -> str:
    return "text" if _type_of(value) in ("input_text", "output_text") else "other"


InputPart = Annotated[Union[Annotated[InputTextPart, Tag("text")],
                            Annotated[UnsupportedInputPart, Tag("other")]],
                      Discriminator(_part_kind)]


class MessageItem(_Model):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(_Model):
    """A call the model made in an earlier turn (sent back when not continuing by id)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = "{}"
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Model):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputPart]
    id: str | None = None
    status: str | None = None


class UnsupportedItem(_Model):
    type: str


_ITEM_TAGS = {"message": "message", "function_call": "function_call",
              "function_call_output": "function_call_output"}


def _item_kind(value: Any) -> str:
    return _ITEM_TAGS.get(_type_of(value, "message"), "other")


InputItem = Annotated[Union[Annotated[MessageItem, Tag("message")],
                            Annotated[FunctionCallItem, Tag("function_call")],
                            Annotated[FunctionCallOutputItem, Tag("function_call_output")],
                            Annotated[UnsupportedItem, Tag("other")]],
                      Discriminator(_item_kind)]


class FunctionTool(_Model):
    type: Literal["function"]
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class UnsupportedTool(_Model):
    type: str


def _tool_kind(value: Any) -> str:
    return "function" if _type_of(value) == "function" else "other"


Tool = Annotated[Union[Annotated[FunctionTool, Tag("function")],
                       Annotated[UnsupportedTool, Tag("other")]], Discriminator(_tool_kind)]


class NamedFunctionChoice(_Model):
    type: Literal["function"]
    name: str


class TextFormat(_Model):
    """``text`` (free), ``json_object``, or ``json_schema`` (name, schema, strict). An
    unknown or misspelled key is a 400 naming it (it would drop the constraint silently)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Model):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None    # the only one the model can honour


class ResponsesRequest(_Model):
    """POST /v1/responses."""

    model: str | None = None                       # omitted: the served model
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None            # a routing hint: accepted, no effect
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    cache_salt: str | None = None                  # vLLM: a separate namespace in the tenant
    metadata: dict[str, str] | None = None         # echoed in the response
    user: str | None = None
    safety_identifier: str | None = None
    text: TextConfig | None = None
    truncation: Literal["disabled"] | None = None
    background: Literal[False] | None = None
    reasoning: dict[str, Any] | None = None        # only null / {} / effort "none"
    include: list[Literal["reasoning.encrypted_content"]] | None = None  # no reasoning items
    top_logprobs: Literal[0] | None = None
