"""What both APIs share: the request's way in (rate limit, preparing slot, body, model,
engine) and the streamed answer's skeleton (refusals before the 200, text frames, the end
or an error event, a client that went away). Each API module converts only its own wire
format: a ``StreamFormat`` turns engine events into that API's frames.

A frame is ``(event name or None, data)``: data is a JSON-able dict or a raw string (the
OpenAI ``[DONE]``).
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel

from radixgate.gateway.errors import ApiError
from radixgate.gateway.http_util import parse_body, principal_of, state_of
from radixgate.gateway.service import Generation, finished_error
from radixgate.gateway.sse import open_stream, send_event
from radixgate.runtime.engine.api import Finished, TextDelta

Frame = tuple[str | None, dict | str]
M = TypeVar("M", bound=BaseModel)


@contextlib.asynccontextmanager
async def admitted_body(request: web.Request, model: type[M]):
    """``async with admitted_body(request, Model) as (state, principal, body):`` the
    tenant's rate limit first, then one of its preparing slots (radixgate/gateway/prepare.py) for
    reading, parsing and everything the block does (rendering): no tenant's pre-engine work
    can crowd out another's. The body's model name must be served (404 otherwise); an
    omitted one (OpenAI) becomes the served model's id."""
    state, principal = state_of(request), principal_of(request)
    state.check_rate(principal)
    async with state.preparing(principal):
        body = await parse_body(request, model)
        served = state.resolve_model(body.model)
        if body.model is None:            # an OpenAI request that names no model
            body.model = served
        yield state, principal, body


class StreamFormat(Protocol):
    """One API's frames for one streamed answer."""

    def start(self, first: TextDelta | Finished) -> list[Frame]: ...
    def delta(self, event: TextDelta) -> list[Frame]: ...   # new text (and its logprobs)
    def end(self, finished: Finished) -> list[Frame]: ...
    def error(self, error: ApiError) -> list[Frame]: ...   # the stream ends in this error

    @property
    def has_tool_call(self) -> bool: ...


async def stream_answer(request: web.Request, generation: Generation,
                        frames: StreamFormat) -> web.StreamResponse:
    """Runs ``generation`` as server-sent events. The 200 goes out only after the engine's
    first event, so a refusal (429, 529, 400) is a plain error response; an error after it
    is the API's error event. A client that went away ends the stream quietly (leaving the
    ``Generation`` aborts the request, freeing its blocks)."""
    async with generation:
        first = await generation.first_event()
        response = await open_stream(request)
        try:
            await _send(response, frames.start(first))
            if isinstance(first, TextDelta):
                await _send(response, frames.delta(first))
                async for event in generation.rest():
                    if isinstance(event, TextDelta):
                        await _send(response, frames.delta(event))
            await _finish(response, generation, frames)
        except ConnectionResetError:
            pass
    return response


async def stream_choices(request: web.Request, generations: list[Generation],
                         streams: list[StreamFormat], closing) -> web.StreamResponse:
    """Several choices (``n`` > 1, batched prompts) as one SSE stream: each choice's frames
    as its events arrive, then ``closing(finished_list)`` (aggregate usage, ``[DONE]``).
    Refusals come before the 200; an error in one choice ends the stream with it (the
    others are aborted)."""
    async with contextlib.AsyncExitStack() as stack:
        for generation in generations:
            await stack.enter_async_context(generation)
        firsts = [await g.first_event() for g in generations]
        response = await open_stream(request)
        queue: asyncio.Queue = asyncio.Queue()
        pumps = [asyncio.create_task(_pump(i, g, f, queue))
                 for i, (g, f) in enumerate(zip(generations, firsts))]
        try:
            for stream, first in zip(streams, firsts):
                await _send(response, stream.start(first))
            if await _relay(response, queue, generations, streams):
                await _send(response, closing([g.finished for g in generations]))
        except ConnectionResetError:
            pass
        finally:
            for pump in pumps:
                pump.cancel()
    return response


async def _pump(index: int, generation: Generation, first, queue: asyncio.Queue) -> None:
    await queue.put((index, first))
    if isinstance(first, TextDelta):
        async for event in generation.rest():
            await queue.put((index, event))
    await queue.put((index, None))


async def _relay(response, queue: asyncio.Queue, generations, streams) -> bool:
    """Sends the choices' frames in arrival order; False when one ended in an error."""
    remaining = len(generations)
    while remaining:
        index, event = await queue.get()
        if isinstance(event, TextDelta):
            await _send(response, streams[index].delta(event))
        elif event is None:
            remaining -= 1
            error = finished_error(generations[index].finished)
            if error is not None:
                await _send(response, streams[index].error(error))
                return False
            await _send(response, streams[index].end(generations[index].finished))
    return True


async def _finish(response, generation: Generation, frames: StreamFormat) -> None:
    error = finished_error(generation.finished)
    if error is not None:
        await _send(response, frames.error(error))
        return
    await _send(response, frames.end(generation.finished))
    if frames.has_tool_call:
        generation.expect_continuation()


async def _send(response, frames: list[Frame]) -> None:
    for event, data in frames:
        await send_event(response, data, event)
