"""GET /openapi.json: an OpenAPI 3.1 document of every endpoint.

Request bodies come straight from the pydantic models (``models_json_schema``), so the
document cannot drift from what the handlers validate. Responses document the success
shape and each API's error envelope.
"""
from __future__ import annotations

import functools

from aiohttp import web
from pydantic.json_schema import models_json_schema

from radixgate.gateway.admin import FlushRequest, PrefixRequest
from radixgate.gateway.anthropic.schemas import CountTokensRequest, MessagesRequest
from radixgate.gateway.openai.schemas import ChatCompletionRequest, CompletionRequest
from radixgate.gateway.gemini.schemas import (CachedContentCreate, CachedContentPatch,
                                              GeminiCountTokensRequest, GenerateContentRequest)
from radixgate.gateway.openai.responses.schemas import ResponsesRequest

_REF = "#/components/schemas/{model}"
_BODIES = (MessagesRequest, CountTokensRequest, ChatCompletionRequest, CompletionRequest,
           ResponsesRequest, FlushRequest, PrefixRequest, GenerateContentRequest,
           GeminiCountTokensRequest, CachedContentCreate, CachedContentPatch)

_OBJECT = {"type": "object"}
_ANTHROPIC_ERROR = {"type": "object", "required": ["type", "error"], "properties": {
    "type": {"const": "error"}, "error": {"type": "object", "required": ["type", "message"],
                                          "properties": {"type": {"type": "string"},
                                                         "message": {"type": "string"}}}}}
_OPENAI_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
_ANTHROPIC_MESSAGE = {"type": "object", "required": ["id", "type", "role", "content", "usage"],
                      "properties": {"id": {"type": "string"}, "type": {"const": "message"},
                                     "content": {"type": "array"}, "usage": {
                                         "type": "object", "required": [
                                             "input_tokens", "output_tokens",
                                             "cache_read_input_tokens",
                                             "cache_creation_input_tokens"]}}}
_OPENAI_RESPONSE = {"type": "object", "required": ["id", "object", "status", "output"],
                    "properties": {"id": {"type": "string"}, "object": {"const": "response"},
                                   "status": {"type": "string"}, "output": {"type": "array"},
                                   "usage": {"type": ["object", "null"]}}}
_USAGE_QUERY = [{"name": name, "in": "query", "required": False, "schema": schema}
                for name, schema in (("from", {"type": "string", "format": "date"}),
                                     ("to", {"type": "string", "format": "date"}),
                                     ("format", {"type": "string", "enum": ["json", "csv"]}))]
_GEMINI_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message", "status"], "properties": {
        "code": {"type": "integer"}, "message": {"type": "string"},
        "status": {"type": "string"}}}}}
_MODEL = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
_CACHE_ID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
_RESPONSE_ID = [{"name": "response_id", "in": "path", "required": True,
                 "schema": {"type": "string"}}]
_OPENAI_COMPLETION = {"type": "object", "required": ["id", "object", "choices"],
                      "properties": {"id": {"type": "string"}, "choices": {"type": "array"},
                                     "usage": {"type": "object"}}}


def add_routes(app: web.Application) -> None:
    app.router.add_get("/openapi.json", openapi_json)


async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(build_openapi())


@functools.cache
def build_openapi() -> dict:
    _, defs = models_json_schema([(m, "validation") for m in _BODIES], ref_template=_REF)
    schemas = dict(defs.get("$defs", {}))
    schemas.update({"AnthropicError": _ANTHROPIC_ERROR, "OpenAIError": _OPENAI_ERROR,
                    "GeminiError": _GEMINI_ERROR,
                    "AnthropicMessage": _ANTHROPIC_MESSAGE, "OpenAICompletion": _OPENAI_COMPLETION,
                    "OpenAIResponse": _OPENAI_RESPONSE})
    return {
        "openapi": "3.1.0",
        "info": {"title": "radixgate", "version": "0.1.0", "description":
                 "Prompt-prefix caching inference gateway: Anthropic Messages (cache_control "
                 "breakpoints) and OpenAI APIs, cache statistics and administration."},
        "components": {"schemas": schemas, "securitySchemes": {
            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            "bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"apiKey": []}, {"bearer": []}],
        "paths": _paths(),
    }


def _ref(name: str) -> dict:
    return {"$ref": _REF.format(model=name)}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _errors(error_schema: str, codes: tuple[int, ...]) -> dict:
    return {str(code): {"description": "error", "content": _json(_ref(error_schema))}
            for code in codes}


def _post(summary: str, body: str | None, ok: dict, error: str, codes: tuple[int, ...],
          stream: bool = False, required: bool = True) -> dict:
    content = _json(ok)
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    op = {"summary": summary, "responses": {"200": {"description": "success", "content": content},
                                            **_errors(error, codes)}}
    if body is not None:
        op["requestBody"] = {"required": required, "content": _json(_ref(body))}
    return op


def _get(summary: str, ok: dict, error: str = "OpenAIError", codes=(401, 503),
         content_type: str = "application/json", auth: bool = True) -> dict:
    op = {"summary": summary, "responses": {
        "200": {"description": "success", "content": {content_type: {"schema": ok}}},
        **_errors(error, codes)}}
    if not auth:
        op["security"] = []
    return op


def _gemini_paths(gen: tuple[int, ...]) -> dict:
    """Google's Gemini API (``/v1beta/``): generation, token counts, explicit caches."""
    def post(summary, body, codes=gen):
        return {**_post(summary, body, _OBJECT, "GeminiError", codes), "parameters": _MODEL}
    caches = (400, 401, 404, 429, 503)
    return {
        "/v1beta/models/{model}:generateContent": {"post": post(
            "Generate content (Gemini)", "GenerateContentRequest", gen + (504,))},
        "/v1beta/models/{model}:countTokens": {"post": post(
            "Count tokens (Gemini)", "GeminiCountTokensRequest")},
        "/v1beta/cachedContents": {
            "post": _post("Create an explicit cache (Gemini)", "CachedContentCreate", _OBJECT,
                          "GeminiError", caches),
            "get": _get("List the caller's explicit caches", _OBJECT, "GeminiError",
                        codes=(400, 401))},
        "/v1beta/cachedContents/{id}": {
            "get": {**_get("Get an explicit cache", _OBJECT, "GeminiError", codes=(401, 404)),
                    "parameters": _CACHE_ID},
            "patch": {**_post("Move an explicit cache's expiry", "CachedContentPatch", _OBJECT,
                              "GeminiError", (400, 401, 404)), "parameters": _CACHE_ID},
            "delete": {**_get("Delete an explicit cache", _OBJECT, "GeminiError",
                              codes=(401, 404)), "parameters": _CACHE_ID}},
    }


def _usage_get() -> dict:
    """GET /v1/cache/usage: JSON, or CSV with ``format=csv``."""
    op = _get("Cache accounting per UTC day (the caller's tenant; admin: all), JSON or CSV",
              _OBJECT, codes=(400, 401))
    op["responses"]["200"]["content"]["text/csv"] = {"schema": {"type": "string"}}
    return {**op, "parameters": _USAGE_QUERY}


def _paths() -> dict:
    gen = (400, 401, 404, 408, 413, 429, 503)
    admin = (400, 401, 403, 503)
    return {
        "/v1/messages": {"post": _post("Create a message (Anthropic)", "MessagesRequest",
                                       _ref("AnthropicMessage"), "AnthropicError",
                                       gen + (504, 529), stream=True)},
        "/v1/messages/count_tokens": {"post": _post(
            "Count prompt tokens (Anthropic)", "CountTokensRequest",
            {"type": "object", "required": ["input_tokens"],
             "properties": {"input_tokens": {"type": "integer"}}}, "AnthropicError", gen)},
        "/v1/chat/completions": {"post": _post("Chat completion (OpenAI)", "ChatCompletionRequest",
                                               _ref("OpenAICompletion"), "OpenAIError",
                                               gen + (504,), stream=True)},
        "/v1/completions": {"post": _post("Text completion (OpenAI)", "CompletionRequest",
                                          _ref("OpenAICompletion"), "OpenAIError",
                                          gen + (504,), stream=True)},
        "/v1/responses": {"post": _post("Create a response (OpenAI Responses API; "
                                        "previous_response_id continues a stored turn)",
                                        "ResponsesRequest", _ref("OpenAIResponse"),
                                        "OpenAIError", gen + (504,), stream=True)},
        "/v1/responses/{response_id}": {
            "get": {**_get("Get a stored response (the caller's own)", _ref("OpenAIResponse"),
                           codes=(401, 404)), "parameters": _RESPONSE_ID},
            "delete": {**_get("Delete a stored response", _OBJECT, codes=(401, 404)),
                       "parameters": _RESPONSE_ID}},
        "/v1/models": {"get": _get("List models", _OBJECT)},
        "/v1/models/{model_id}": {"get": {**_get("Get a model (id or alias)", _OBJECT,
                                                 codes=(401, 404, 503)), "parameters": [
            {"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}]}},
        "/health": {"get": _get("Liveness and readiness (503 while loading)", _OBJECT,
                                codes=(503,), auth=False)},
        "/metrics": {"get": _get("Prometheus metrics", {"type": "string"},
                                 content_type="text/plain")},
        "/v1/cache/stats": {"get": _get("Cache statistics (scoped to the caller; top_prefixes "
                                        "from the caller's own namespaces; admin: "
                                        "tree.namespaces, live cache namespaces)", _OBJECT)},
        **_gemini_paths(gen),
        "/v1/cache/usage": {"get": _usage_get()},
        "/v1/cache/diagnostics/{request_id}": {"get": {**_get(
            "Why a recent request of the caller's tenant missed the cache", _OBJECT,
            codes=(401, 404)), "parameters": [{"name": "request_id", "in": "path",
                                              "required": True, "schema": {"type": "string"}}]}},
        "/v1/cache/flush": {"post": _post("Flush the cache (admin)", "FlushRequest", _OBJECT,
                                          "OpenAIError", admin, required=False)},
        "/v1/cache/prefixes": {
            "get": _get("List pinned prefixes (admin)", _OBJECT, codes=(401, 403, 503)),
            "post": _post("Publish or pin a prefix (admin)", "PrefixRequest", _OBJECT,
                          "OpenAIError", admin),
            "delete": _post("Unpin a prefix (admin)", "PrefixRequest", _OBJECT,
                            "OpenAIError", admin)},
        "/v1/admin/integrity": {"get": _get("Recount the cache's blocks (admin)", _OBJECT,
                                            codes=(401, 403, 503))},
        "/openapi.json": {"get": _get("This document", _OBJECT, codes=(), auth=False)},
    }
