"""POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages API).

Usage is exact and adds up: ``input_tokens`` (uncached, incl. the recomputed last prompt
token) + ``cache_creation_input_tokens`` + ``cache_read_input_tokens`` == prompt tokens.
A stream waits for the engine's first event before sending the 200, so refusals (429,
529, 400 too long) arrive as plain errors and ``message_start`` carries the exact usage;
an error after the 200 becomes an ``error`` event.
"""
from __future__ import annotations

import json

from aiohttp import web

from radixgate.gateway.anthropic.cache_diagnostics import response_fields
from radixgate.gateway.anthropic.convert import convert_messages_request
from radixgate.gateway.anthropic.schemas import CountTokensRequest, MessagesRequest
from radixgate.gateway.errors import Api, ApiError
from radixgate.gateway.gemini.cross_api import with_cached_content
from radixgate.gateway.http_util import request_id_of
from radixgate.gateway.pipeline import Ask, admit, prompt_tokens
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.streaming import Frame, admitted_body, stream_answer
from radixgate.gateway.output import AnswerReader, cut_short, read_answer
from radixgate.runtime.engine.api import Finished, FinishReason, Usage

_STOP_REASONS = {FinishReason.EOS: "end_turn", FinishReason.LENGTH: "max_tokens",
                 FinishReason.STOP_SEQUENCE: "stop_sequence"}


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)


async def count_tokens(request: web.Request) -> web.Response:
    async with admitted_body(request, CountTokensRequest) as (state, principal, body):
        tokens = await prompt_tokens(state, principal, convert_messages_request(body))
    return web.json_response({"input_tokens": len(tokens)})


def _ask(state, principal, body: MessagesRequest) -> Ask:
    converted = with_cached_content(state, principal.tenant, body.cached_content,
                                    convert_messages_request(body), bool(body.tools))
    return Ask("anthropic", body, converted, max_tokens=body.max_tokens,
               stop=body.stop_sequences, cache_salt=body.cache_salt)


async def messages(request: web.Request) -> web.StreamResponse:
    admitted = await admit(request, MessagesRequest, _ask)
    body, converted, generation = admitted.body, admitted.ask.converted, admitted.generation
    message_id = "msg_" + request_id_of(request).removeprefix("req_")
    extra = response_fields(admitted)        # {"diagnostics": ...} when asked for
    if body.stream:
        return await stream_answer(request, generation,
                                   MessageStream(converted, body.model, message_id, extra))
    async with generation:
        finished = await generation.result()
    response_body = message_body(message_id, body.model, converted, finished, extra)
    if response_body["stop_reason"] == "tool_use":
        generation.expect_continuation()
    return web.json_response(response_body)


def usage_body(usage: Usage, output_tokens: int | None = None) -> dict:
    return {
        "input_tokens": usage.uncached_tokens,
        "cache_creation_input_tokens": usage.cache_creation_tokens,
        "cache_read_input_tokens": usage.cache_read_tokens,
        "cache_creation": {"ephemeral_5m_input_tokens": usage.cache_creation_5m_tokens,
                           "ephemeral_1h_input_tokens": usage.cache_creation_1h_tokens},
        "output_tokens": usage.output_tokens if output_tokens is None else output_tokens,
        "service_tier": "standard",
    }


def message_body(message_id: str, model: str, converted: ConvertedPrompt,
                 finished: Finished, extra: dict | None = None) -> dict:
    """The Message; ``extra``: more fields (``diagnostics``, anthropic/cache_diagnostics.py)."""
    answer = read_answer(converted, finished.text, "toolu_")
    content = [_block(kind, value) for kind, value in answer.items]
    has_tool = any(kind == "tool" for kind, _ in answer.items)
    stop = _stop_reason(finished, has_tool, cut_short(finished, answer.ends_in_call))
    return {"id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop,
            "stop_sequence": finished.stop_sequence, "usage": usage_body(finished.usage),
            **(extra or {})}


def _block(kind: str, value) -> dict:
    if kind == "text":
        return {"type": "text", "text": value}
    return {"type": "tool_use", "id": value.id, "name": value.name, "input": value.arguments}


def _stop_reason(finished: Finished, has_tool: bool, cut: bool) -> str:
    """``max_tokens`` when it cut the answer, even after finished calls (a call it cut is
    left out), else ``tool_use`` when the answer has calls, else the engine's reason."""
    if cut:
        return "max_tokens"
    if has_tool:
        return "tool_use"
    return _STOP_REASONS.get(finished.reason, "end_turn")


class MessageStream:
    """message_start, content_block_* (text and tool_use blocks), message_delta,
    message_stop; an error closes the open block and ends with an ``error`` event."""

    def __init__(self, converted: ConvertedPrompt, model: str, message_id: str,
                 extra: dict | None = None):
        self.converted = converted
        self.extra = extra or {}          # more fields of message_start's message
        self.model = model
        self.message_id = message_id
        self.index = -1
        self.open_text = False
        self.has_tool_call = False
        self.reader = AnswerReader(converted, "toolu_")

    def start(self, first) -> list[Frame]:
        usage = first.usage if first.usage is not None else Usage()
        message = {"id": self.message_id, "type": "message", "role": "assistant",
                   "model": self.model, "content": [], "stop_reason": None,
                   "stop_sequence": None, "usage": usage_body(usage), **self.extra}
        return [_frame({"type": "message_start", "message": message}), _frame({"type": "ping"})]

    def delta(self, event) -> list[Frame]:
        return self._items(self.reader.feed(event.text))

    def _items(self, items) -> list[Frame]:
        return [frame for kind, value in items for frame in self._item(kind, value)]

    def end(self, finished: Finished) -> list[Frame]:
        frames = self._items(self.reader.finish()) + self._close_text()
        stop = _stop_reason(finished, self.has_tool_call,
                            cut_short(finished, self.reader.ends_in_call))
        self.has_tool_call = stop == "tool_use"     # a cut answer expects no tool results
        delta = {"stop_reason": stop, "stop_sequence": finished.stop_sequence}
        return frames + [_frame({"type": "message_delta", "delta": delta,
                                 "usage": usage_body(finished.usage)}),
                         _frame({"type": "message_stop"})]

    def error(self, error: ApiError) -> list[Frame]:
        return self._close_text() + [("error", error.body(Api.ANTHROPIC))]

    def _close_text(self) -> list[Frame]:
        if not self.open_text:
            return []
        self.open_text = False
        return [_frame({"type": "content_block_stop", "index": self.index})]

    def _item(self, kind: str, value) -> list[Frame]:
        if kind == "text":
            return self._text_delta(value) if value else []
        frames = self._close_text()
        self.index += 1
        self.has_tool_call = True
        block = {"type": "tool_use", "id": value.id, "name": value.name, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(value.arguments)}
        return frames + [
            _frame({"type": "content_block_start", "index": self.index, "content_block": block}),
            _frame({"type": "content_block_delta", "index": self.index, "delta": delta}),
            _frame({"type": "content_block_stop", "index": self.index})]

    def _text_delta(self, text: str) -> list[Frame]:
        frames = []
        if not self.open_text:
            self.index += 1
            self.open_text = True
            frames.append(_frame({"type": "content_block_start", "index": self.index,
                                  "content_block": {"type": "text", "text": ""}}))
        frames.append(_frame({"type": "content_block_delta", "index": self.index,
                              "delta": {"type": "text_delta", "text": text}}))
        return frames


def _frame(data: dict) -> Frame:
    """An Anthropic event: its name is its ``type``."""
    return data["type"], data
