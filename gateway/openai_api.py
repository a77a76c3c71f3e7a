"""POST /v1/chat/completions, POST /v1/completions, GET /v1/models (OpenAI API).

``usage.prompt_tokens_details.cached_tokens`` is the exact count of prompt tokens read from
the cache. ``prompt_cache_key`` is accepted as a routing hint only; ``cache_salt`` (vLLM)
selects a separate namespace within the caller's tenant. A stream waits for the first
engine event before sending the 200 (refusals arrive as plain errors); an error after the
200 is sent as a ``data: {"error": ...}`` chunk.
"""
from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from radixgate.gateway.convert_openai import convert_chat_request
from radixgate.gateway.api_common import Frame, admitted_body, stream_answer
from radixgate.gateway.errors import Api, ApiError, Kind
from radixgate.gateway.logprobs import (chat_content, chat_logprobs, chat_logprobs_asked,
                                        completion_logprobs)
from radixgate.gateway.http_util import request_id_of, state_of
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.schemas_openai import ChatCompletionRequest, CompletionRequest
from radixgate.gateway.prepare import check_length_bound, room_for_prompt, too_long
from radixgate.gateway.service import (Generation, answer_tokens, engine_request,
                                       render_request, reserved_for, sampling_params)
from radixgate.gateway.tools import ToolCallParser, split_output
from radixgate.runtime.api import Finished, FinishReason, Usage

_FINISH = {FinishReason.EOS: "stop", FinishReason.STOP_SEQUENCE: "stop",
           FinishReason.LENGTH: "length"}


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id}", get_model)


def _reject_unsupported(body) -> None:
    if body.n != 1:
        raise ApiError(Kind.BAD_REQUEST, "n > 1 is not supported: request one choice at a time",
                       param="n")


def usage_body(usage: Usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.output_tokens,
            "total_tokens": usage.prompt_tokens + usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
            "completion_tokens_details": {"reasoning_tokens": 0}}


async def chat_completions(request: web.Request) -> web.StreamResponse:
    async with admitted_body(request, ChatCompletionRequest) as (state, principal, body):
        _reject_unsupported(body)
        state.require_engine()
        converted = convert_chat_request(body)
        asked = body.max_completion_tokens or body.max_tokens
        rendered = await render_request(state, principal, converted,
                                         reserved=reserved_for(state, asked))
        max_tokens = answer_tokens(state, asked, len(rendered.tokens))
        asked_logprobs = chat_logprobs_asked(body.logprobs, body.top_logprobs)
        sampling = sampling_params(body, max_tokens=max_tokens, stop=body.stop,
                                   logprobs=asked_logprobs)
        engine_req = await engine_request(state, principal, request_id_of(request),
                                          rendered.tokens, rendered.breakpoints, sampling,
                                          body.cache_salt)
    token_bytes = state.tokenizer.token_to_bytes if asked_logprobs is not None else None
    generation = Generation(state, request, principal, "openai", engine_req)
    completion_id = "chatcmpl-" + request_id_of(request).removeprefix("req_")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream:
        chunks = ChatStream(completion_id, body.model, converted, include_usage, token_bytes)
        return await stream_answer(request, generation, chunks)
    async with generation:
        finished = await generation.result()
    response_body = _chat_body(completion_id, body.model, converted, finished, token_bytes)
    if response_body["choices"][0]["finish_reason"] == "tool_calls":
        generation.expect_continuation()
    return web.json_response(response_body)


def _chat_body(completion_id: str, model: str, converted: ConvertedPrompt,
               finished: Finished, token_bytes=None) -> dict:
    """``token_bytes`` set: the request asked for logprobs (gateway/logprobs.py)."""
    text = converted.output_prefix + finished.text
    items = split_output(text, converted.tool_names, "call_") if converted.tool_names else (
        [("text", text)])
    content = "".join(v for k, v in items if k == "text")
    calls = [_tool_call(v) for k, v in items if k == "tool"]
    message = {"role": "assistant", "content": content if (content or not calls) else None,
               "refusal": None}
    if calls:
        message["tool_calls"] = calls
    choice = {"index": 0, "message": message,
              "logprobs": chat_logprobs(finished.logprobs, token_bytes) if token_bytes else None,
              "finish_reason": "tool_calls" if calls else _FINISH.get(finished.reason, "stop")}
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": usage_body(finished.usage),
            "system_fingerprint": None}


def _tool_call(call, index: int | None = None) -> dict:
    out = {"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
    if index is not None:
        out["index"] = index
    return out


class ChatStream:
    """chat.completion.chunk objects for one streamed completion."""

    def __init__(self, completion_id: str, model: str, converted: ConvertedPrompt,
                 include_usage: bool, token_bytes=None):
        self.base = {"id": completion_id, "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model, "system_fingerprint": None}
        self.include_usage = include_usage
        self.token_bytes = token_bytes      # set: logprobs ride on the chunks
        self._logprobs: list = []           # of tokens whose text no chunk carried yet
        self.parser = ToolCallParser(converted.tool_names, "call_") if converted.tool_names else None
        self.prefix = converted.output_prefix
        self.num_calls = 0

    def _chunk(self, delta: dict, finish_reason=None) -> dict:
        chunk = {**self.base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                           "finish_reason": finish_reason}]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    @property
    def has_tool_call(self) -> bool:
        return self.num_calls > 0

    def start(self, first) -> list[Frame]:
        return [(None, self._chunk({"role": "assistant", "content": ""}))]

    def delta(self, event) -> list[Frame]:
        self._logprobs.extend(event.logprobs)
        return self._with_logprobs(self.text(event.text))

    def text(self, text: str) -> list[Frame]:
        if self.prefix:
            text, self.prefix = self.prefix + text, ""
        items = self.parser.feed(text) if self.parser else [("text", text)]
        return [(None, self._item(k, v)) for k, v in items if k != "text" or v]

    def end(self, finished: Finished) -> list[Frame]:
        out = self.text("") if self.prefix else []
        out += [(None, self._item(k, v)) for k, v in (self.parser.finish() if self.parser else [])]
        reason = "tool_calls" if self.num_calls else _FINISH.get(finished.reason, "stop")
        out.append((None, self._chunk({}, reason)))
        return self._with_logprobs(out) + _usage_and_done(self.base, self.include_usage, finished)

    def _with_logprobs(self, frames: list[Frame]) -> list[Frame]:
        """The first chunk carries the logprobs of every token not reported yet."""
        if self.token_bytes is None or not frames or not self._logprobs:
            return frames
        frames[0][1]["choices"][0]["logprobs"] = {
            "content": chat_content(self._logprobs, self.token_bytes), "refusal": None}
        self._logprobs = []
        return frames

    def error(self, error: ApiError) -> list[Frame]:
        return _error_and_done(error)

    def _item(self, kind: str, value) -> dict:
        if kind == "text":
            return self._chunk({"content": value})
        self.num_calls += 1
        return self._chunk({"tool_calls": [_tool_call(value, self.num_calls - 1)]})


def _usage_and_done(base: dict, include_usage: bool, finished: Finished) -> list[Frame]:
    usage = [(None, {**base, "choices": [], "usage": usage_body(finished.usage)})]
    return (usage if include_usage else []) + [(None, "[DONE]")]


def _error_and_done(error: ApiError) -> list[Frame]:
    return [(None, error.body(Api.OPENAI)), (None, "[DONE]")]


# -- /v1/completions ----------------------------------------------------------------------

def _prompt_tokens(state, body: CompletionRequest, room: int, max_tokens: int) -> list[int]:
    """The prompt's token ids; 400 when it cannot fit ``room`` (a text's cheap length
    bound is checked before it is tokenized)."""
    tokens = _given_tokens(state, body, room, max_tokens)
    if len(tokens) > room:
        raise too_long(room, max_tokens, context=room + max_tokens, at_least=len(tokens))
    return tokens


def _given_tokens(state, body: CompletionRequest, room: int, max_tokens: int) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError(Kind.BAD_REQUEST, "batched prompts are not supported: send one "
                           "prompt per request", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(Kind.BAD_REQUEST, "prompt must not be empty", param="prompt")
        check_length_bound([prompt], state.tokenizer, room, max_tokens)
        return state.tokenizer.encode(prompt)
    if not prompt:
        raise ApiError(Kind.BAD_REQUEST, "prompt must not be empty", param="prompt")
    vocab = state.tokenizer.vocab_size
    if any(t < 0 or t >= vocab for t in prompt):
        raise ApiError(Kind.BAD_REQUEST, f"prompt token ids must lie in [0, {vocab})",
                       param="prompt")
    return list(prompt)


async def completions(request: web.Request) -> web.StreamResponse:
    async with admitted_body(request, CompletionRequest) as (state, principal, body):
        _reject_unsupported(body)
        if body.echo or body.suffix:
            raise ApiError(Kind.BAD_REQUEST, "echo and suffix are not supported",
                           param="echo" if body.echo else "suffix")
        engine = state.require_engine()
        asked = body.max_tokens or 16
        reserved = reserved_for(state, asked)
        room = room_for_prompt(engine.max_model_len, reserved)
        tokens = await asyncio.to_thread(_prompt_tokens, state, body, room, reserved)
        max_tokens = answer_tokens(state, asked, len(tokens))
        sampling = sampling_params(body, max_tokens=max_tokens, stop=body.stop,
                                   logprobs=body.logprobs)
        engine_req = await engine_request(state, principal, request_id_of(request), tokens, (),
                                          sampling, body.cache_salt)
    token_bytes = state.tokenizer.token_to_bytes if body.logprobs is not None else None
    generation = Generation(state, request, principal, "openai", engine_req)
    completion_id = "cmpl-" + request_id_of(request).removeprefix("req_")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream:
        return await stream_answer(request, generation, CompletionStream(
            completion_id, body.model, include_usage, token_bytes))
    async with generation:
        finished = await generation.result()
    choice = {"index": 0, "text": finished.text,
              "logprobs": (completion_logprobs(finished.logprobs, token_bytes) if token_bytes
                           else None),
              "finish_reason": _FINISH.get(finished.reason, "stop")}
    return web.json_response({"id": completion_id, "object": "text_completion",
                              "created": int(time.time()), "model": body.model,
                              "choices": [choice], "usage": usage_body(finished.usage),
                              "system_fingerprint": None})


class CompletionStream:
    def __init__(self, completion_id: str, model: str, include_usage: bool, token_bytes=None):
        self.base = {"id": completion_id, "object": "text_completion",
                     "created": int(time.time()), "model": model, "system_fingerprint": None}
        self.include_usage = include_usage
        self.token_bytes = token_bytes      # set: each chunk carries its tokens' logprobs
        self.offset = 0                     # text sent so far (text_offset of the next token)

    def _chunk(self, text: str, finish_reason=None) -> dict:
        chunk = {**self.base, "choices": [{"index": 0, "text": text, "logprobs": None,
                                           "finish_reason": finish_reason}]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    has_tool_call = False          # plain completions never parse tool calls

    def start(self, first) -> list[Frame]:
        return []

    def delta(self, event) -> list[Frame]:
        if not event.text:
            return []
        chunk = self._chunk(event.text)
        if self.token_bytes is not None:
            chunk["choices"][0]["logprobs"] = completion_logprobs(
                event.logprobs, self.token_bytes, self.offset)
        self.offset += len(event.text)
        return [(None, chunk)]

    def end(self, finished: Finished) -> list[Frame]:
        return ([(None, self._chunk("", _FINISH.get(finished.reason, "stop")))]
                + _usage_and_done(self.base, self.include_usage, finished))

    def error(self, error: ApiError) -> list[Frame]:
        return _error_and_done(error)


# -- /v1/models ---------------------------------------------------------------------------

def _model_entry(state, anthropic: bool) -> dict:
    created = int(time.time() - state.book.uptime_s())
    if anthropic:
        return {"type": "model", "id": state.model_name, "display_name": state.model_name,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))}
    return {"id": state.model_name, "object": "model", "created": created,
            "owned_by": "radixgate", "max_model_len": state.config.model.max_model_len,
            "aliases": list(state.config.model.aliases)}


async def list_models(request: web.Request) -> web.Response:
    """OpenAI shape; Anthropic's when the client sends ``anthropic-version``."""
    state = state_of(request)
    if "anthropic-version" in request.headers:
        entry = _model_entry(state, True)
        return web.json_response({"data": [entry], "has_more": False,
                                  "first_id": entry["id"], "last_id": entry["id"]})
    return web.json_response({"object": "list", "data": [_model_entry(state, False)]})


async def get_model(request: web.Request) -> web.Response:
    state = state_of(request)
    state.resolve_model(request.match_info["model_id"])
    return web.json_response(_model_entry(state, "anthropic-version" in request.headers))
