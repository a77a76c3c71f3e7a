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

from radixgate.gateway.convert_anthropic import convert_messages_request
from radixgate.gateway.errors import Api, ApiError, Kind, from_engine
from radixgate.gateway.http_util import parse_body, principal_of, request_id_of, state_of
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.schemas_anthropic import CountTokensRequest, MessagesRequest
from radixgate.gateway.service import (Generation, engine_request, render_request,
                                       sampling_params)
from radixgate.gateway.sse import open_stream, send_event
from radixgate.gateway.tools import ToolCallParser, split_output
from radixgate.runtime.api import Finished, FinishReason, TextDelta, Usage

_STOP_REASONS = {FinishReason.EOS: "end_turn", FinishReason.LENGTH: "max_tokens",
                 FinishReason.STOP_SEQUENCE: "stop_sequence"}


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)


async def count_tokens(request: web.Request) -> web.Response:
    state, principal = state_of(request), principal_of(request)
    state.check_rate(principal)
    async with state.preparing(principal):
        body = await parse_body(request, CountTokensRequest)
        state.resolve_model(body.model)
        rendered = await render_request(state, principal, convert_messages_request(body),
                                        reserved=0)
    return web.json_response({"input_tokens": len(rendered.tokens)})


async def messages(request: web.Request) -> web.StreamResponse:
    state, principal = state_of(request), principal_of(request)
    state.check_rate(principal)
    async with state.preparing(principal):
        body = await parse_body(request, MessagesRequest)
        state.resolve_model(body.model)
        state.require_engine()
        converted = convert_messages_request(body)
        sampling = sampling_params(max_tokens=body.max_tokens, temperature=body.temperature,
                                   top_p=body.top_p, top_k=body.top_k, seed=None,
                                   stop=body.stop_sequences)
        rendered = await render_request(state, principal, converted, reserved=body.max_tokens)
    engine_req = engine_request(state, principal, request_id_of(request), rendered.tokens,
                                rendered.breakpoints, sampling, body.cache_salt)
    generation = Generation(state, request, principal, "anthropic", engine_req)
    message_id = "msg_" + request_id_of(request).removeprefix("req_")
    if body.stream:
        return await _stream(request, generation, converted, body.model, message_id)
    async with generation:
        finished = await generation.result()
    response_body = message_body(message_id, body.model, converted, finished)
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
                 finished: Finished) -> dict:
    text = converted.output_prefix + finished.text
    items = split_output(text, converted.tool_names, "toolu_") if converted.tool_names else (
        [("text", text)] if text else [])
    content = [_block(kind, value) for kind, value in items]
    has_tool = any(kind == "tool" for kind, _ in items)
    return {"id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": _stop_reason(finished, has_tool),
            "stop_sequence": finished.stop_sequence, "usage": usage_body(finished.usage)}


def _block(kind: str, value) -> dict:
    if kind == "text":
        return {"type": "text", "text": value}
    return {"type": "tool_use", "id": value.id, "name": value.name, "input": value.arguments}


def _stop_reason(finished: Finished, has_tool: bool) -> str:
    if has_tool:
        return "tool_use"
    return _STOP_REASONS.get(finished.reason, "end_turn")


async def _stream(request: web.Request, generation: Generation, converted: ConvertedPrompt,
                  model: str, message_id: str) -> web.StreamResponse:
    async with generation:
        first = await generation.first_event()          # refusals raise before the 200
        response = await open_stream(request)
        try:
            await _stream_events(response, generation, converted, model, message_id, first)
        except ConnectionResetError:
            pass                                         # client gone: __aexit__ aborts
    return response


async def _stream_events(response, generation: Generation, converted: ConvertedPrompt,
                         model: str, message_id: str, first) -> None:
    usage = first.usage if first.usage is not None else Usage()
    start = {"id": message_id, "type": "message", "role": "assistant", "model": model,
             "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": usage_body(usage)}
    await send_event(response, {"type": "message_start", "message": start}, "message_start")
    await send_event(response, {"type": "ping"}, "ping")
    writer = _BlockWriter(response, converted)
    if isinstance(first, TextDelta):
        await writer.feed(first.text)
        async for event in generation.rest():
            if isinstance(event, TextDelta):
                await writer.feed(event.text)
    finished = generation.finished
    if finished.reason in (FinishReason.ERROR, FinishReason.ABORTED):
        await writer.close()
        error = (from_engine(finished.error_kind, finished.error_message, finished.request_id)
                 if finished.reason is FinishReason.ERROR
                 else ApiError(Kind.OVERLOADED, finished.error_message or "request aborted"))
        await response.write(error.sse_event(Api.ANTHROPIC).encode())
        return
    await writer.finish()
    if writer.has_tool:
        generation.expect_continuation()
    delta = {"stop_reason": _stop_reason(finished, writer.has_tool),
             "stop_sequence": finished.stop_sequence}
    await send_event(response, {"type": "message_delta", "delta": delta,
                                "usage": usage_body(finished.usage)}, "message_delta")
    await send_event(response, {"type": "message_stop"}, "message_stop")


class _BlockWriter:
    """Turns output text into content_block_* events (text blocks and tool_use blocks)."""

    def __init__(self, response, converted: ConvertedPrompt):
        self.response = response
        self.index = -1
        self.open_text = False
        self.has_tool = False
        self.parser = (ToolCallParser(converted.tool_names, "toolu_")
                       if converted.tool_names else None)
        self._prefix = converted.output_prefix

    async def feed(self, text: str) -> None:
        if self._prefix:
            text, self._prefix = self._prefix + text, ""
        items = self.parser.feed(text) if self.parser else [("text", text)]
        for kind, value in items:
            await self._emit(kind, value)

    async def finish(self) -> None:
        if self._prefix:
            await self.feed("")
        for kind, value in (self.parser.finish() if self.parser else []):
            await self._emit(kind, value)
        await self.close()

    async def close(self) -> None:
        if self.open_text:
            await self._send({"type": "content_block_stop", "index": self.index})
            self.open_text = False

    async def _emit(self, kind: str, value) -> None:
        if kind == "text":
            if not value:
                return
            if not self.open_text:
                self.index += 1
                self.open_text = True
                await self._send({"type": "content_block_start", "index": self.index,
                                  "content_block": {"type": "text", "text": ""}})
            await self._send({"type": "content_block_delta", "index": self.index,
                              "delta": {"type": "text_delta", "text": value}})
            return
        await self.close()
        self.index += 1
        self.has_tool = True
        await self._send({"type": "content_block_start", "index": self.index, "content_block": {
            "type": "tool_use", "id": value.id, "name": value.name, "input": {}}})
        await self._send({"type": "content_block_delta", "index": self.index, "delta": {
            "type": "input_json_delta", "partial_json": json.dumps(value.arguments)}})
        await self._send({"type": "content_block_stop", "index": self.index})

    async def _send(self, data: dict) -> None:
        await send_event(self.response, data, data["type"])
