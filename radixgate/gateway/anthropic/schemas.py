"""Pydantic models of the Anthropic Messages API requests (the HTTP edge only).

Unknown top-level fields are ignored (SDKs add new ones); content types the model cannot
take (images, documents, ...) parse as ``UnsupportedBlock`` so the converter can answer a
clear 400 instead of a generic validation error.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)   # "yes" is not a bool, "4" not an int


def _whole_number(value):
    """JSON has one number type: ``1e12``, ``1000000000000.0`` and ``1000000000000`` are the
    same count of tokens, so a number with an integral value is that integer whatever its
    spelling; a fraction is refused."""
    if isinstance(value, float):
        if not value.is_integer():
            raise PydanticCustomError("int_from_float", "Input should be a whole number")
        return int(value)
    return value


# ``max_tokens`` and its kin: a whole number >= 1 however it is spelled, of any size (a
# count beyond the room left in the context window is clamped to it, as 32000 is; with
# ``[server] strict_max_tokens`` it is a 400 naming it)
TokenCount = Annotated[int, BeforeValidator(_whole_number), Field(ge=1)]


class CacheControl(_Model):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"


class TextBlock(_Model):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class UnsupportedBlock(_Model):
    """Content this text-only model cannot read; answered with a 400 naming the type."""

    type: Literal["image", "document", "search_result", "thinking", "redacted_thinking",
                  "server_tool_use", "web_search_tool_result", "container_upload"]
    cache_control: CacheControl | None = None


class ToolUseBlock(_Model):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(_Model):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[Union[TextBlock, UnsupportedBlock], Field(discriminator="type")]] | None = None
    is_error: bool = False
    cache_control: CacheControl | None = None


ContentBlock = Annotated[Union[TextBlock, ToolUseBlock, ToolResultBlock, UnsupportedBlock],
                         Field(discriminator="type")]


class InputMessage(_Model):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(_Model):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: bool | None = None    # arguments of a forced call always match input_schema


class ToolChoice(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class JsonOutputFormat(_Model):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Model):
    format: JsonOutputFormat | None = None
    effort: str | None = None     # accepted; this model has one effort


class Metadata(_Model):
    user_id: str | None = None


class Diagnostics(_Model):
    """Anthropic's cache diagnostics (anthropic/cache_diagnostics.py); another field is a 400."""

    model_config = ConfigDict(extra="forbid", strict=True)
    previous_message_id: str | None = None     # null: a first turn, nothing to compare


class Thinking(_Model):
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = None


class PromptFields(_Model):
    model: str
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    cache_control: CacheControl | None = None
    thinking: Thinking | None = None                  # only {"type": "disabled"} is served
    service_tier: Literal["auto", "standard_only"] | None = None   # one tier: "standard"
    output_config: OutputConfig | None = None         # format: a JSON schema for the answer
    output_format: JsonOutputFormat | None = None     # the same, its earlier beta name


class MessagesRequest(PromptFields):
    """POST /v1/messages."""

    max_tokens: TokenCount
    cached_content: str | None = None   # extension: a Gemini explicit cache's name first
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = None
    # vLLM's extra sampling fields, served here too (extensions: Anthropic's API has none
    # of them, so no Anthropic client sends them by accident; each reaches the sampler)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    min_tokens: int | None = Field(default=None, ge=0)
    ignore_eos: bool = False
    speculative: bool | None = None    # extension: false turns speculative drafts off
    stream: bool = False
    metadata: Metadata | None = None
    cache_salt: str | None = None      # extension (as vLLM's): a separate cache namespace
    diagnostics: Diagnostics | None = None   # why the cache missed a previous message's prefix


class CountTokensRequest(PromptFields):
    """POST /v1/messages/count_tokens."""
