"""POST /v1/chat/completions (n choices, logprobs, tools) (OpenAI API).

``usage.prompt_tokens_details.cached_tokens`` is the exact count of prompt tokens read from
the cache. ``prompt_cache_retention: "24h"`` pins the prompt (openai/retention.py; the tokens
it pins are ``prompt_tokens_details.cache_creation_tokens``, and the response names the
retention). ``prompt_cache_key`` is accepted as a routing hint only; ``cache_salt`` (vLLM)
selects a separate namespace within the caller's tenant. A stream waits for the first
engine event before sending the 200 (refusals arrive as plain errors); an error after the
200 is sent as a ``data: {"error": ...}`` chunk.
"""
from __future__ import annotations

import json
import time

from aiohttp import web

from radixgate.gateway.openai.convert import convert_chat_request
from radixgate.gateway.openai.choices import openai_usage, results, shared_prompt_usage
from radixgate.gateway.errors import Api, ApiError, Kind
from radixgate.gateway.gemini.cross_api import with_cached_content
from radixgate.gateway.openai.retention import retention_pin_s
from radixgate.gateway.openai.logprobs import chat_content, chat_logprobs, chat_logprobs_asked
from radixgate.gateway.http_util import request_id_of
from radixgate.gateway.openai.schemas import ChatCompletionRequest
from radixgate.gateway.pipeline import Ask, admit
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.streaming import Frame, stream_answer, stream_choices
from radixgate.gateway.output import AnswerReader, cut_short, read_answer
from radixgate.gateway.tools import PartialCall, ToolCall
from radixgate.runtime.engine.api import Finished, FinishReason, Usage

FINISH_REASONS = {FinishReason.EOS: "stop", FinishReason.STOP_SEQUENCE: "stop",
           FinishReason.LENGTH: "length"}


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)


MAX_CHOICES = 16        # n: choices of one prompt (they share its prefill)


def reject_unsupported(body) -> None:
    if body.n > MAX_CHOICES:
        raise ApiError(Kind.BAD_REQUEST, f"n must be at most {MAX_CHOICES}", param="n")


def usage_body(usage: Usage) -> dict:
    return openai_usage(usage.prompt_tokens, usage.cache_read_tokens, usage.output_tokens,
                        usage.cache_creation_tokens)


def _ask(state, principal, body: ChatCompletionRequest) -> Ask:
    reject_unsupported(body)
    converted = with_cached_content(state, principal.tenant, body.cached_content,
                                    convert_chat_request(body), bool(body.tools))
    return Ask("openai", body, converted,
               max_tokens=body.max_completion_tokens or body.max_tokens, stop=body.stop,
               n=body.n, logprobs=chat_logprobs_asked(body.logprobs, body.top_logprobs),
               cache_salt=body.cache_salt, routing_hint=body.prompt_cache_key,
               pin_prompt_s=retention_pin_s(state, body.prompt_cache_retention))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    admitted = await admit(request, ChatCompletionRequest, _ask)
    state, body, converted = admitted.state, admitted.body, admitted.ask.converted
    generations = admitted.generations
    token_bytes = state.tokenizer.token_to_bytes if admitted.ask.logprobs is not None else None
    completion_id = "chatcmpl-" + request_id_of(request).removeprefix("req_")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    if body.stream:
        return await _stream_chat(request, generations, completion_id, body.model, converted,
                                  include_usage, token_bytes)
    finished = await results(generations)
    response_body = chat_body(completion_id, body.model, converted, finished, token_bytes)
    if body.prompt_cache_retention is not None:
        response_body["prompt_cache_retention"] = body.prompt_cache_retention
    for generation, choice in zip(generations, response_body["choices"]):
        if choice["finish_reason"] == "tool_calls":
            generation.expect_continuation()
    return web.json_response(response_body)


async def _stream_chat(request, generations, completion_id, model, converted, include_usage,
                       token_bytes) -> web.StreamResponse:
    if len(generations) == 1:
        chunks = ChatStream(completion_id, model, converted, include_usage, token_bytes)
        return await stream_answer(request, generations[0], chunks)
    streams = [ChatStream(completion_id, model, converted, include_usage, token_bytes,
                          index=i, final=False) for i in range(len(generations))]
    base = streams[0].base

    def closing(finished: list[Finished]) -> list[Frame]:
        return usage_and_done(base, include_usage, shared_prompt_usage(finished))

    return await stream_choices(request, generations, streams, closing)


def chat_body(completion_id: str, model: str, converted: ConvertedPrompt,
               finished: list[Finished], token_bytes=None) -> dict:
    """One choice per finished request (``n``); ``token_bytes`` set: the request asked for
    logprobs (radixgate/gateway/openai/logprobs.py)."""
    choices = [_chat_choice(i, converted, f, token_bytes) for i, f in enumerate(finished)]
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": shared_prompt_usage(finished),
            "system_fingerprint": None}


def _chat_choice(index: int, converted: ConvertedPrompt, finished: Finished,
                 token_bytes) -> dict:
    answer = read_answer(converted, finished.text, "call_")
    content = "".join(v for k, v in answer.items if k == "text")
    calls = [_tool_call(v) for k, v in answer.items if k == "tool"]
    cut = cut_short(finished, answer.ends_in_call)
    if cut and answer.partial is not None:
        calls.append(_tool_call(answer.partial))
    message = {"role": "assistant", "content": content if (content or not calls) else None,
               "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return {"index": index, "message": message,
            "logprobs": chat_logprobs(finished.logprobs, token_bytes) if token_bytes else None,
            "finish_reason": _finish_reason(finished, cut, bool(calls))}


def _finish_reason(finished: Finished, cut: bool, has_calls: bool) -> str:
    """``length`` when max_tokens cut the answer (a call it cut is in ``tool_calls`` with
    the arguments' JSON text so far, as OpenAI sends it), else ``tool_calls`` or the stop."""
    if cut:
        return "length"
    return "tool_calls" if has_calls else FINISH_REASONS.get(finished.reason, "stop")


def _tool_call(call: ToolCall | PartialCall, index: int | None = None) -> dict:
    arguments = (call.arguments_text if isinstance(call, PartialCall)
                 else json.dumps(call.arguments))
    out = {"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": arguments}}
    if index is not None:
        out["index"] = index
    return out


class ChatStream:
    """chat.completion.chunk objects for one streamed completion."""

    def __init__(self, completion_id: str, model: str, converted: ConvertedPrompt,
                 include_usage: bool, token_bytes=None, index: int = 0, final: bool = True):
        """``index``: the choice's index; ``final`` False: one choice of several, whose end
        sends no usage and no ``[DONE]`` (``stream_choices`` closes the stream)."""
        self.index, self.final = index, final
        self.base = {"id": completion_id, "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": model, "system_fingerprint": None}
        self.include_usage = include_usage
        self.token_bytes = token_bytes      # set: logprobs ride on the chunks
        self._logprobs: list = []           # of tokens whose text no chunk carried yet
        self.reader = AnswerReader(converted, "call_")
        self.num_calls = 0
        self.finish_reason: str | None = None

    def _chunk(self, delta: dict, finish_reason=None) -> dict:
        chunk = {**self.base, "choices": [{"index": self.index, "delta": delta, "logprobs": None,
                                           "finish_reason": finish_reason}]}
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    @property
    def has_tool_call(self) -> bool:
        """The answer ended in tool calls (its client will send their results)."""
        return self.finish_reason == "tool_calls"

    def start(self, first) -> list[Frame]:
        return [(None, self._chunk({"role": "assistant", "content": ""}))]

    def delta(self, event) -> list[Frame]:
        self._logprobs.extend(event.logprobs)
        return self._with_logprobs(self._items(self.reader.feed(event.text)))

    def _items(self, items) -> list[Frame]:
        return [(None, self._item(k, v)) for k, v in items if k != "text" or v]

    def end(self, finished: Finished) -> list[Frame]:
        out = self._items(self.reader.finish())
        cut = cut_short(finished, self.reader.ends_in_call)
        if cut and self.reader.partial is not None:
            out.append((None, self._item("tool", self.reader.partial)))
        self.finish_reason = _finish_reason(finished, cut, self.num_calls > 0)
        out.append((None, self._chunk({}, self.finish_reason)))
        if not self.final:
            return self._with_logprobs(out)
        return self._with_logprobs(out) + usage_and_done(self.base, self.include_usage,
                                                         usage_body(finished.usage))

    def _with_logprobs(self, frames: list[Frame]) -> list[Frame]:
        """The first chunk carries the logprobs of every token not reported yet."""
        if self.token_bytes is None or not frames or not self._logprobs:
            return frames
        frames[0][1]["choices"][0]["logprobs"] = {
            "content": chat_content(self._logprobs, self.token_bytes), "refusal": None}
        self._logprobs = []
        return frames

    def error(self, error: ApiError) -> list[Frame]:
        return error_and_done(error)

    def _item(self, kind: str, value) -> dict:
        if kind == "text":
            return self._chunk({"content": value})
        self.num_calls += 1
        return self._chunk({"tool_calls": [_tool_call(value, self.num_calls - 1)]})


def usage_and_done(base: dict, include_usage: bool, usage: dict) -> list[Frame]:
    """A stream's end: the usage chunk (when asked for) and ``[DONE]``."""
    chunk = [(None, {**base, "choices": [], "usage": usage})]
    return (chunk if include_usage else []) + [(None, "[DONE]")]


def error_and_done(error: ApiError) -> list[Frame]:
    return [(None, error.body(Api.OPENAI)), (None, "[DONE]")]
