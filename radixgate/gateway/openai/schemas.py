"""Pydantic models of the OpenAI Chat Completions and Completions requests (HTTP edge).

Every sampling field here reaches the sampler (``service.sampling_params``): OpenAI's
``temperature``, ``top_p``, ``seed``, ``presence_penalty``, ``frequency_penalty``,
``logit_bias`` and vLLM's extras ``top_k``, ``min_p``, ``repetition_penalty``,
``min_tokens``, ``ignore_eos``. Fields that do not change the answer (``user``,
``metadata``) are ignored; ones it cannot honour (``n > 1``, ``logprobs``, ``echo``, image
parts) are rejected with a 400 naming the parameter.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from radixgate.gateway.anthropic.schemas import CacheControl, TokenCount


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)   # "yes" is not a bool, "4" not an int


class _Closed(_Model):
    """A structured-output object: an unknown or misspelled key is a 400 naming it (it would
    otherwise drop the constraint silently), unlike unknown top-level fields."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Model):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class UnsupportedPart(_Model):
    type: Literal["image_url", "input_audio", "file", "refusal"]


ContentPart = Annotated[Union[TextPart, UnsupportedPart], Field(discriminator="type")]


class FunctionCall(_Model):
    name: str
    arguments: str = "{}"


class ToolCallIn(_Model):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessageIn(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Model):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class ToolDef(_Model):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaFormat(_Closed):
    name: str = Field(default="response", pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Closed):
    """``text`` (free), ``json_object`` (any JSON object) or ``json_schema`` (that schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Closed):
    """vLLM's ``structured_outputs``: exactly one of json, regex, choice, grammar or
    json_object constrains the output. ``disable_any_whitespace`` and ``disable_fallback``
    hold already (JSON is generated without free whitespace; there is no fallback backend);
    vLLM's other keys (``structural_tag``, ``whitespace_pattern``, ...) are a 400."""

    json_: dict[str, Any] | str | bool | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool | None = None
    disable_fallback: bool | None = None


class StreamOptions(_Model):
    include_usage: bool = False


class _SamplingFields(_Model):
    model: str | None = None           # omitted: the served model
    max_tokens: TokenCount | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None   # openai/retention.py
    cache_salt: str | None = None
    user: str | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    # vLLM's extra sampling fields (``extra_body`` in the openai SDK)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_tokens: int | None = Field(default=None, ge=0)
    ignore_eos: bool = False
    speculative: bool | None = None   # extension: false turns speculative drafts off
    # structured output: OpenAI's response_format, vLLM's structured_outputs and its
    # older guided_* names (radixgate/gateway/constraint_fields.py)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    cached_content: str | None = None   # extension: a Gemini explicit cache's name first
    max_completion_tokens: TokenCount | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(_SamplingFields):
    """POST /v1/completions: ``prompt`` is text or token ids (one prompt per request)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
