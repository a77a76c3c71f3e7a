"""Where a request's events go when submitted from asyncio: ``AsyncSink`` + ``RequestHandle``.

The engine thread calls ``sink.put(event)``; it never blocks and never raises (a closed
event loop just drops the event: its consumer is gone).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from .api import Event, Finished


class AsyncSink:
    """Feeds an asyncio.Queue that lives on ``loop`` (thread-safe via call_soon_threadsafe)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue()

    def put(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:   # the loop is closed: nobody is listening any more
            pass


class RequestHandle:
    """The caller's side of one request: ``async for event in handle`` yields TextDelta
    events and then exactly one Finished, after which iteration stops. ``abort()`` is
    idempotent; a Finished(reason="aborted") follows if the request had not ended. Used as
    ``async with handle:`` it aborts on exit when the request is still running (for example
    when the consuming task is cancelled because its client disconnected)."""

    def __init__(self, request_id: str, sink: AsyncSink, abort: Callable[[str], object]):
        self.request_id = request_id
        self._sink = sink
        self._abort = abort
        self.finished: Finished | None = None

    def __aiter__(self) -> "RequestHandle":
        return self

    async def __anext__(self) -> Event:
        if self.finished is not None:
            raise StopAsyncIteration
        event = await self._sink.queue.get()
        if isinstance(event, Finished):
            self.finished = event
        return event

    async def result(self) -> Finished:
        """Consumes the remaining events and returns the Finished one."""
        async for _ in self:
            pass
        assert self.finished is not None
        return self.finished

    def abort(self) -> None:
        if self.finished is None:
            self._abort(self.request_id)

    async def __aenter__(self) -> "RequestHandle":
        return self

    async def __aexit__(self, *exc) -> None:
        self.abort()
