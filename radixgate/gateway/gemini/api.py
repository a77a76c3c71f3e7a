"""POST /v1beta/models/{model}:generateContent, :streamGenerateContent (SSE, ``alt=sse``) and
:countTokens (Google's Gemini API), on the one handler pipeline.

The answer is ``candidates`` (``candidateCount`` of them, one engine request each sharing
the prompt's prefill) of ``model`` parts: text, and ``functionCall`` parts cut out of the
output as for the other APIs; ``finishReason`` STOP or MAX_TOKENS. ``usageMetadata``:
``promptTokenCount``, ``candidatesTokenCount``, ``totalTokenCount`` and, when the prompt was
read from the cache (an explicit cache or an implicit prefix match),
``cachedContentTokenCount``. A request naming ``cachedContent`` (caches.py) takes the cache's
system instruction, tools and turns first; it may not set its own (400, as Gemini).
"""
from __future__ import annotations

from aiohttp import web

from radixgate.gateway.errors import Api, ApiError, Kind
from radixgate.gateway.gemini.cache_store import CACHES, handle_prefix
from radixgate.gateway.gemini.convert import CachedPrefix, convert_prompt
from radixgate.gateway.gemini.schemas import (GeminiCountTokensRequest, GenerateContentRequest,
                                              GenerationConfig)
from radixgate.gateway.http_util import request_id_of
from radixgate.gateway.openai.choices import results
from radixgate.gateway.output import AnswerReader, answer_items
from radixgate.gateway.pipeline import Ask, admit, prompt_tokens
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.streaming import Frame, admitted_body, stream_answer
from radixgate.runtime.engine.api import Finished, FinishReason

MODEL = r"{model:[^/:]+}"
FINISH = {FinishReason.EOS: "STOP", FinishReason.STOP_SEQUENCE: "STOP",
          FinishReason.LENGTH: "MAX_TOKENS"}


def add_routes(app: web.Application) -> None:
    app.router.add_post(f"/v1beta/models/{MODEL}:generateContent", generate_content)
    app.router.add_post(f"/v1beta/models/{MODEL}:streamGenerateContent", stream_generate)
    app.router.add_post(f"/v1beta/models/{MODEL}:countTokens", count_tokens)


def cache_store(request: web.Request):
    return request.app[CACHES]


def cached_prefix(request: web.Request, tenant: str, body: GenerateContentRequest,
                  state) -> CachedPrefix | None:
    """The explicit cache ``body`` names (404 when the tenant has no such live cache)."""
    if body.cached_content is None:
        return None
    if body.system_instruction is not None or body.tools or body.tool_config is not None:
        raise ApiError(Kind.BAD_REQUEST, "CachedContent can not be used with GenerateContent "
                       "request setting system_instruction, tools or tool_config.",
                       param="cachedContent")
    handle = cache_store(request).get(tenant, body.cached_content)
    if handle is None:
        raise ApiError(Kind.NOT_FOUND, f"CachedContent not found (or permission denied): "
                       f"{body.cached_content}", param="cachedContent")
    try:
        state.resolve_model(handle.model)
    except ApiError:
        raise ApiError(Kind.BAD_REQUEST, f"cachedContent {handle.name} was created for model "
                       f"{handle.model!r}, which this server no longer serves",
                       param="cachedContent") from None
    return handle_prefix(handle)


def _asker(request: web.Request, stream: bool):
    def ask(state, principal, body: GenerateContentRequest) -> Ask:
        state.resolve_model(request.match_info["model"])
        generation = body.generation_config or GenerationConfig()
        n = generation.candidate_count or 1
        if stream and n > 1:
            raise ApiError(Kind.BAD_REQUEST, "generationConfig.candidateCount: a stream has one "
                           "candidate", param="generationConfig.candidateCount")
        prefix = cached_prefix(request, principal.tenant, body, state)
        converted = convert_prompt(body, generation, prefix)
        return Ask("gemini", generation, converted, max_tokens=generation.max_output_tokens,
                   stop=generation.stop_sequences, n=n)
    return ask


async def generate_content(request: web.Request) -> web.StreamResponse:
    admitted = await admit(request, GenerateContentRequest, _asker(request, stream=False))
    finished = await results(admitted.generations)
    converted = admitted.ask.converted
    candidates = [_candidate(i, converted, f) for i, f in enumerate(finished)]
    return web.json_response({
        "candidates": candidates, "usageMetadata": usage_metadata(finished),
        "modelVersion": admitted.state.model_name, "responseId": request_id_of(request)})


async def stream_generate(request: web.Request) -> web.StreamResponse:
    if request.query.get("alt", "sse") != "sse":
        raise ApiError(Kind.BAD_REQUEST, "streamGenerateContent answers server-sent events "
                       "only: alt=sse", param="alt")
    admitted = await admit(request, GenerateContentRequest, _asker(request, stream=True))
    frames = GeminiStream(admitted.ask.converted, admitted.state.model_name,
                          request_id_of(request))
    return await stream_answer(request, admitted.generation, frames)


async def count_tokens(request: web.Request) -> web.Response:
    async with admitted_body(request, GeminiCountTokensRequest) as (state, principal, body):
        state.resolve_model(request.match_info["model"])
        inner = body.generate_content_request or GenerateContentRequest(contents=body.contents)
        prefix = cached_prefix(request, principal.tenant, inner, state)
        tokens = await prompt_tokens(state, principal, convert_prompt(inner, None, prefix))
    answer = {"totalTokens": len(tokens)}
    if prefix is not None:
        answer["cachedContentTokenCount"] = cache_store(request).get(
            principal.tenant, inner.cached_content).token_count
    return web.json_response(answer)


def usage_metadata(finished: list[Finished]) -> dict:
    """Gemini's usage: the prompt counted once (candidates share it)."""
    first = finished[0].usage
    output = sum(f.usage.output_tokens for f in finished)
    usage = {"promptTokenCount": first.prompt_tokens, "candidatesTokenCount": output,
             "totalTokenCount": first.prompt_tokens + output}
    if first.cache_read_tokens:
        usage["cachedContentTokenCount"] = first.cache_read_tokens
    return usage


def _candidate(index: int, converted: ConvertedPrompt, finished: Finished) -> dict:
    parts = [_part(kind, value) for kind, value in answer_items(converted, finished.text, "call_")]
    return {"content": {"role": "model", "parts": parts or [{"text": ""}]},
            "finishReason": FINISH.get(finished.reason, "OTHER"), "index": index}


def _part(kind: str, value) -> dict:
    if kind == "text":
        return {"text": value}
    return {"functionCall": {"id": value.id, "name": value.name, "args": value.arguments}}


class GeminiStream:
    """One ``GenerateContentResponse`` per event: the new parts, then a last one with the
    finish reason and the usage; an error after the 200 is a ``data: {"error": ...}``."""

    def __init__(self, converted: ConvertedPrompt, model: str, response_id: str):
        self.reader = AnswerReader(converted, "call_")
        self.model, self.response_id = model, response_id
        self.has_tool_call = False

    def start(self, first) -> list[Frame]:
        return []

    def delta(self, event) -> list[Frame]:
        return self._parts(self.reader.feed(event.text))

    def end(self, finished: Finished) -> list[Frame]:
        parts = [_part(k, v) for k, v in self.reader.finish()]
        self.has_tool_call |= any("functionCall" in p for p in parts)
        candidate = {"content": {"role": "model", "parts": parts or [{"text": ""}]},
                     "finishReason": FINISH.get(finished.reason, "OTHER"), "index": 0}
        return [(None, self._response(candidate, usage_metadata([finished])))]

    def error(self, error: ApiError) -> list[Frame]:
        return [(None, error.body(Api.GEMINI))]

    def _parts(self, items) -> list[Frame]:
        parts = [_part(k, v) for k, v in items if k != "text" or v]
        if not parts:
            return []
        self.has_tool_call |= any("functionCall" in p for p in parts)
        candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
        return [(None, self._response(candidate))]

    def _response(self, candidate: dict, usage: dict | None = None) -> dict:
        body = {"candidates": [candidate], "modelVersion": self.model,
                "responseId": self.response_id}
        if usage is not None:
            body["usageMetadata"] = usage
        return body
