"""POST /v1/responses, GET and DELETE /v1/responses/{id} (OpenAI Responses API).

The request becomes the equivalent chat conversation (openai/responses/convert.py) and runs
through the one handler pipeline (radixgate/gateway/pipeline.py) like chat completions. Tool calls in
the output become ``function_call`` items.

Stored responses (``store``, default true) live in memory per tenant (store.py:
1 h TTL, LRU-bounded); ``previous_response_id`` continues from the stored turn's token
ids (prompt + output as generated), so the earlier turn's KV is reused exactly;
another tenant's id, an expired one or one sent with ``store: false`` is a 404.
``prompt_cache_retention: "24h"`` pins the prompt (openai/retention.py: a day in the disk
tier, an hour without one); ``prompt_cache_key`` is accepted as a routing hint only.

Streams send the Responses events (``response.created`` ... ``response.completed``, or
``response.incomplete`` when the answer hit ``max_output_tokens``), each with its
``sequence_number``; an error after the 200 is a ``response.failed`` event.
"""
from __future__ import annotations

import json
import secrets
import time

from aiohttp import web

from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.http_util import principal_of
from radixgate.gateway.openai.retention import retention_pin_s
from radixgate.gateway.openai.responses.convert import (ResponsesTurn, continuation_base,
                                                        convert_continuation,
                                                        convert_first_turn, stored_tokens,
                                                        tools_body)
from radixgate.gateway.openai.responses.schemas import NamedFunctionChoice, ResponsesRequest
from radixgate.gateway.openai.responses.store import ResponseStore, StoredTurn
from radixgate.gateway.output import AnswerReader, cut_short, read_answer
from radixgate.gateway.pipeline import Ask, Continuation, admit
from radixgate.gateway.streaming import Frame, stream_answer
from radixgate.gateway.tools import ToolCall
from radixgate.runtime.engine.api import Finished, TextDelta, Usage

STORE = web.AppKey("response_store", ResponseStore)
_FAILED_CODES = {Kind.RATE_LIMIT: "rate_limit_exceeded", Kind.BAD_REQUEST: "invalid_prompt"}


def add_routes(app: web.Application) -> None:
    app[STORE] = ResponseStore()
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)


def usage_body(usage: Usage) -> dict:
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cache_read_tokens,
                                     "cache_write_tokens": usage.cache_creation_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.output_tokens}


def reject_unsupported(body: ResponsesRequest) -> None:
    reasoning = body.reasoning or {}
    if reasoning.get("effort") not in (None, "none") or reasoning.get("summary") is not None:
        raise ApiError(Kind.BAD_REQUEST, "reasoning is not supported: this model does not "
                       "reason (omit it, or send effort 'none')", param="reasoning")


def _previous(store: ResponseStore, tenant: str, response_id: str | None) -> StoredTurn | None:
    if response_id is None:
        return None
    stored = store.get(tenant, response_id)
    if stored is None:
        raise ApiError(Kind.NOT_FOUND, f"Previous response with id '{response_id}' not found.",
                       param="previous_response_id")
    return stored


def _asker(store: ResponseStore):
    def ask(state, principal, body: ResponsesRequest) -> Ask:
        reject_unsupported(body)
        stored = _previous(store, principal.tenant, body.previous_response_id)
        turn = convert_continuation(body, stored) if stored else convert_first_turn(body)
        salt = body.cache_salt if body.cache_salt is not None or stored is None else (
            stored.cache_salt)
        continuation = None if stored is None else Continuation(
            continuation_base(stored, state.tokenizer.eos_token_ids), stored.roles)
        return Ask("responses", body, turn.converted, continuation=continuation,
                   max_tokens=body.max_output_tokens, cache_salt=salt,
                   routing_hint=body.prompt_cache_key, pin_prompt_s=retention_pin_s(state, body.prompt_cache_retention),
                   note=turn)
    return ask


async def create_response(request: web.Request) -> web.StreamResponse:
    store = request.app[STORE]
    admitted = await admit(request, ResponsesRequest, _asker(store))
    principal, body, generation = admitted.principal, admitted.body, admitted.generation
    turn, salt, engine_req = admitted.ask.note, admitted.ask.cache_salt, generation.request
    builder = ResponseBuilder(body, turn)

    def save(finished: Finished, response_body: dict) -> None:
        if body.store:
            store.put(principal.tenant, StoredTurn(
                builder.response_id, stored_tokens(engine_req.tokens, finished.output_token_ids),
                turn.roles, turn.instructions, turn.tools, salt, response_body))

    if body.stream:
        return await stream_answer(request, generation, ResponseStream(builder, save))
    async with generation:
        finished = await generation.result()
    output = builder.output_items(finished)
    response_body = builder.final(finished, output)
    save(finished, response_body)
    if response_body["status"] == "completed" and any(
            item["type"] == "function_call" for item in output):
        generation.expect_continuation()
    return web.json_response(response_body)


async def get_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    stored = request.app[STORE].get(principal_of(request).tenant, response_id)
    if stored is None:
        raise ApiError(Kind.NOT_FOUND, f"Response with id '{response_id}' not found.")
    return web.json_response(stored.body)


async def delete_response(request: web.Request) -> web.Response:
    response_id = request.match_info["response_id"]
    if not request.app[STORE].delete(principal_of(request).tenant, response_id):
        raise ApiError(Kind.NOT_FOUND, f"Response with id '{response_id}' not found.")
    return web.json_response({"id": response_id, "object": "response", "deleted": True})


def _new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(24)


class ResponseBuilder:
    """The response object and its output items for one request."""

    def __init__(self, body: ResponsesRequest, turn: ResponsesTurn):
        self.body = body
        self.turn = turn
        self.response_id = _new_id("resp_")
        self.created_at = int(time.time())
        self.ends_in_call = False     # set when the answer is read (output_items, a stream)

    def base(self, status: str) -> dict:
        body = self.body
        choice = body.tool_choice
        if isinstance(choice, NamedFunctionChoice):
            choice = {"type": "function", "name": choice.name}
        return {"id": self.response_id, "object": "response", "created_at": self.created_at,
                "status": status, "background": False, "completed_at": None, "error": None,
                "incomplete_details": None, "instructions": self.turn.instructions,
                "max_output_tokens": body.max_output_tokens, "metadata": body.metadata or {},
                "model": body.model, "output": [],
                "parallel_tool_calls": True if body.parallel_tool_calls is None else (
                    body.parallel_tool_calls),
                "previous_response_id": body.previous_response_id,
                "prompt_cache_key": body.prompt_cache_key,
                "prompt_cache_retention": body.prompt_cache_retention,
                "reasoning": {"effort": None, "summary": None}, "service_tier": "default",
                "store": body.store,
                "temperature": 1.0 if body.temperature is None else body.temperature,
                "text": {"format": _format_body(body), "verbosity": "medium"},
                "tool_choice": choice or "auto", "tools": tools_body(self.turn.tools),
                "top_p": 1.0 if body.top_p is None else body.top_p, "truncation": "disabled",
                "usage": None, "user": body.user}

    def output_items(self, finished: Finished) -> list[dict]:
        """The answer's items (a call it stopped inside is left out); also notes whether
        it ends in a finished call, which ``final`` reads."""
        answer = read_answer(self.turn.converted, finished.text, "call_")
        self.ends_in_call = answer.ends_in_call
        status = "incomplete" if cut_short(finished, self.ends_in_call) else "completed"
        output = [message_item(_new_id("msg_"), value, status) if kind == "text"
                  else call_item(_new_id("fc_"), value) for kind, value in answer.items]
        return output or [message_item(_new_id("msg_"), "", status)]

    def final(self, finished: Finished, output: list[dict]) -> dict:
        """The response: ``incomplete`` (``max_output_tokens``) when max_tokens cut the
        answer, even after finished calls, else ``completed``."""
        incomplete = cut_short(finished, self.ends_in_call)
        response = self.base("incomplete" if incomplete else "completed")
        response.update(output=output, usage=usage_body(finished.usage))
        if incomplete:
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        else:
            response["completed_at"] = int(time.time())
        return response

    def failed(self, error: ApiError, output: list[dict]) -> dict:
        response = self.base("failed")
        code = _FAILED_CODES.get(error.kind, "server_error")
        response.update(output=output, error={"code": code, "message": error.message})
        return response


def _format_body(body: ResponsesRequest) -> dict:
    """The response's ``text.format``: the request's, as given (default ``text``)."""
    fmt = body.text.format if body.text is not None else None
    if fmt is None:
        return {"type": "text"}
    return fmt.model_dump(by_alias=True, exclude_none=True)


def message_item(item_id: str, text: str, status: str) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [_text_part(text)]}


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call: ToolCall, status: str = "completed",
              arguments: str | None = None) -> dict:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call.id,
            "name": call.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False) if arguments is None
            else arguments}


class ResponseStream:
    """The Responses API's stream events for one answer. ``on_done(finished, body)`` runs
    before ``response.completed`` goes out, so a stored response exists once the client
    has seen it."""

    def __init__(self, builder: ResponseBuilder, on_done):
        self.builder = builder
        self.on_done = on_done
        self.reader = AnswerReader(builder.turn.converted, "call_")
        self.sequence_number = 0
        self.output: list[dict] = []          # items already done, in output order
        self.message: dict | None = None      # the message item being streamed
        self.message_text = ""
        self.incomplete = False               # set at the end: max_tokens cut the answer

    @property
    def has_tool_call(self) -> bool:
        """Read at the end: the answer has calls and was not cut (their results follow)."""
        return not self.incomplete and any(
            item["type"] == "function_call" for item in self.output)

    def _event(self, kind: str, **fields) -> Frame:
        data = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return kind, data

    def start(self, first) -> list[Frame]:
        return [self._event("response.created", response=self.builder.base("in_progress")),
                self._event("response.in_progress", response=self.builder.base("in_progress"))]

    def delta(self, event: TextDelta) -> list[Frame]:
        return self._items(self.reader.feed(event.text))

    def _items(self, items) -> list[Frame]:
        frames: list[Frame] = []
        for kind, value in items:
            frames += self._text(value) if kind == "text" else self._call(value)
        return frames

    def _text(self, text: str) -> list[Frame]:
        if not text:
            return []
        frames = [] if self.message is not None else self._open_message()
        self.message_text += text
        return frames + [self._event("response.output_text.delta", **self._where(),
                                     delta=text, logprobs=[])]

    def _where(self) -> dict:
        return {"item_id": self.message["id"], "output_index": len(self.output),
                "content_index": 0}

    def _open_message(self) -> list[Frame]:
        self.message = message_item(_new_id("msg_"), "", "in_progress")
        self.message["content"] = []
        self.message_text = ""
        where = self._where()
        return [self._event("response.output_item.added", output_index=len(self.output),
                            item=self.message),
                self._event("response.content_part.added", **where, part=_text_part(""))]

    def _close_message(self, status: str) -> list[Frame]:
        if self.message is None:
            return []
        where, text = self._where(), self.message_text
        item = message_item(self.message["id"], text, status)
        frames = [self._event("response.output_text.done", **where, text=text, logprobs=[]),
                  self._event("response.content_part.done", **where, part=_text_part(text)),
                  self._event("response.output_item.done", output_index=len(self.output),
                              item=item)]
        self.output.append(item)
        self.message = None
        return frames

    def _call(self, call: ToolCall) -> list[Frame]:
        frames = self._close_message("completed")
        index, item_id = len(self.output), _new_id("fc_")
        done = call_item(item_id, call)
        frames += [
            self._event("response.output_item.added", output_index=index,
                        item=call_item(item_id, call, "in_progress", arguments="")),
            self._event("response.function_call_arguments.delta", item_id=item_id,
                        output_index=index, delta=done["arguments"]),
            self._event("response.function_call_arguments.done", item_id=item_id,
                        output_index=index, name=call.name, arguments=done["arguments"]),
            self._event("response.output_item.done", output_index=index, item=done)]
        self.output.append(done)
        return frames

    def end(self, finished: Finished) -> list[Frame]:
        frames = self._items(self.reader.finish())
        self.builder.ends_in_call = self.reader.ends_in_call
        incomplete = self.incomplete = cut_short(finished, self.reader.ends_in_call)
        if not self.output and self.message is None:
            frames += self._open_message()
        frames += self._close_message("incomplete" if incomplete else "completed")
        response = self.builder.final(finished, self.output)
        self.on_done(finished, response)
        kind = "response.incomplete" if incomplete else "response.completed"
        return frames + [self._event(kind, response=response)]

    def error(self, error: ApiError) -> list[Frame]:
        frames = self._close_message("incomplete")
        return frames + [self._event("response.failed",
                                     response=self.builder.failed(error, self.output))]
