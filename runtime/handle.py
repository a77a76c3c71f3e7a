"""Where a request's events go: an asyncio queue (``RequestHandle``) or a blocking waiter.

The engine thread calls ``sink.put(event)``; it never blocks and never raises (a closed
event loop just drops the event: its consumer is gone).
"""
from __future__ import annotations

import asyncio
import threading
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


class BlockingSink:
    """Collects events for a caller blocked in ``Engine.generate``."""

    def __init__(self, on_event: Callable[[Event], None] | None = None):
        self.events: list[Event] = []
        self.finished: Finished | None = None
        self._done = threading.Event()
        self._on_event = on_event

    def put(self, event: Event) -> None:
        self.events.append(event)
        if self._on_event is not None:
            self._on_event(event)
        if isinstance(event, Finished):
            self.finished = event
            self._done.set()

    def wait(self, timeout: float | None = None) -> Finished | None:
        self._done.wait(timeout)
        return self.finished


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
