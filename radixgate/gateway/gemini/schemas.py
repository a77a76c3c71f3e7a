"""Pydantic models of the Gemini API requests (the HTTP edge only).

Field names are camelCase on the wire (what the google-genai SDK sends); snake_case is
accepted too. Parts the text-only model cannot read (inline data, files, code execution)
parse as themselves and the converter answers a 400 naming them; ``generationConfig`` and
``toolConfig`` refuse fields they do not know (they change what is generated), the top level
ignores them (named in ``x-radixgate-ignored-fields``).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, populate_by_name=True)


class _Closed(_Model):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class FunctionCall(_Model):
    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class FunctionResponse(_Model):
    name: str
    response: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class Part(_Model):
    text: str | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None
    thought: bool | None = None
    inline_data: dict | None = None
    file_data: dict | None = None
    executable_code: dict | None = None
    code_execution_result: dict | None = None

    def unsupported(self) -> str | None:
        """The name of a kind of content this model cannot read, or None."""
        for name in ("inline_data", "file_data", "executable_code", "code_execution_result"):
            if getattr(self, name) is not None:
                return to_camel(name)
        return None


class Content(_Model):
    role: Literal["user", "model", "function"] | None = None
    parts: list[Part] = Field(default_factory=list)


class FunctionDeclaration(_Model):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None              # OpenAPI 3 subset (Gemini's Schema)
    parameters_json_schema: dict[str, Any] | None = None  # plain JSON Schema


class Tool(_Model):
    function_declarations: list[FunctionDeclaration] | None = None
    google_search: dict | None = None
    google_search_retrieval: dict | None = None
    code_execution: dict | None = None
    url_context: dict | None = None


class FunctionCallingConfig(_Closed):
    mode: Literal["AUTO", "ANY", "NONE", "VALIDATED", "MODE_UNSPECIFIED"] = "AUTO"
    allowed_function_names: list[str] | None = None


class ToolConfig(_Closed):
    function_calling_config: FunctionCallingConfig | None = None


class GenerationConfig(_Closed):
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    candidate_count: int | None = Field(default=None, ge=1, le=8)
    max_output_tokens: int | None = Field(default=None, ge=1)
    stop_sequences: list[str] | None = Field(default=None, max_length=5)
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    response_mime_type: str | None = None
    response_schema: dict[str, Any] | None = None
    response_json_schema: dict[str, Any] | None = None


class PromptFields(_Model):
    """What a request and a cached content share."""

    contents: list[Content] = Field(default_factory=list)
    system_instruction: Content | str | None = None
    tools: list[Tool] | None = None
    tool_config: ToolConfig | None = None


class GenerateContentRequest(PromptFields):
    model: str | None = None                 # from the path (``models/{model}:...``)
    generation_config: GenerationConfig | None = None
    cached_content: str | None = None
    safety_settings: list[dict] | None = None   # accepted: this server filters nothing

    # the sampling fields ``service.sampling_params`` reads, from generationConfig
    def _generation(self, name: str):
        config = self.generation_config
        return None if config is None else getattr(config, name)

    temperature = property(lambda self: self._generation("temperature"))
    top_p = property(lambda self: self._generation("top_p"))
    top_k = property(lambda self: self._generation("top_k"))
    seed = property(lambda self: self._generation("seed"))
    presence_penalty = property(lambda self: self._generation("presence_penalty"))
    frequency_penalty = property(lambda self: self._generation("frequency_penalty"))


class GeminiCountTokensRequest(_Model):
    model: str | None = None
    contents: list[Content] = Field(default_factory=list)
    generate_content_request: GenerateContentRequest | None = None


class CachedContentCreate(PromptFields):
    model: str
    display_name: str | None = None
    ttl: str | None = None
    expire_time: str | None = None

    @field_validator("model")
    @classmethod
    def _bare_model(cls, value: str) -> str:
        return value.removeprefix("models/")


class CachedContentPatch(_Closed):
    ttl: str | None = None
    expire_time: str | None = None
    name: str | None = None
    model: str | None = None
    display_name: str | None = None
