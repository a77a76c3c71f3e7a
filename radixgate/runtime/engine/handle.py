"""Where a request's events go when submitted from asyncio: ``AsyncSink`` + ``RequestHandle``.

The engine thread calls ``sink.put(event)``; it never blocks and never raises (a closed
event loop just drops the event: its consumer is gone).

A reader that falls behind (its handler stuck writing to a client that does not read) must
not make the queue grow without bound: past ``max_unsent`` events put but not yet taken,
the sink calls ``on_overflow`` once (the engine ends the request, freeing its blocks),
drops every later TextDelta and keeps the final Finished. On the loop, the sink then
gives its reader ``SLOW_READER_GRACE_S`` seconds to finish (read that Finished and tell
its client) before it cancels the reader task, which closes the connection.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from .api import Event, Finished

SLOW_READER_GRACE_S = 5.0
SLOW_READER_MESSAGE = ("the client read its stream too slowly: more than {limit} events were "
                       "waiting to be sent, so the request was stopped")


class AsyncSink:
    """Feeds an asyncio.Queue that lives on ``loop`` (thread-safe via call_soon_threadsafe).

    ``max_unsent``: events queued but not yet taken before the sink overflows (None: no
    bound). ``on_overflow`` runs once, on the thread that puts (the engine thread): it must
    not block. The first task that takes an event (``get``; a ``RequestHandle``'s
    iteration) is the sink's reader: after an overflow it is cancelled unless it is done
    within ``SLOW_READER_GRACE_S`` seconds.
    The two counters each have one writer (``_put`` the putting thread, ``_taken`` the
    loop), so their difference needs no lock; it may be stale by an event or two.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, max_unsent: int | None = None,
                 on_overflow: Callable[[], object] | None = None):
        self.loop = loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.max_unsent = max_unsent
        self.on_overflow = on_overflow
        self.overflowed = False
        self._reader: asyncio.Task | None = None
        self._put = 0
        self._taken = 0

    @property
    def unsent(self) -> int:
        """Events put and not yet taken by the reader."""
        return self._put - self._taken

    def put(self, event: Event) -> None:
        if not isinstance(event, Finished):
            if self.overflowed:
                return
            if self.max_unsent is not None and self.unsent >= self.max_unsent:
                self._overflow()
                return
        self._put += 1
        self._call(self.queue.put_nowait, event)

    async def get(self) -> Event:
        if self._reader is None:
            self._reader = asyncio.current_task()
        event = await self.queue.get()
        self._taken += 1
        return event

    def _overflow(self) -> None:
        self.overflowed = True
        if self.on_overflow is not None:
            self.on_overflow()
        self._call(self._reader_fell_behind)

    def _reader_fell_behind(self) -> None:
        """On the loop, after an overflow: the reader gets a grace to finish."""
        self.loop.call_later(SLOW_READER_GRACE_S, self._cancel_stuck_reader)

    def _cancel_stuck_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()

    def _call(self, fn: Callable, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:   # the loop is closed: nobody is listening any more
            pass


class RequestHandle:
    """The caller's side of one request: ``async for event in handle`` yields TextDelta
    events and then exactly one Finished, after which iteration stops. ``abort()`` is
    idempotent; a Finished(reason="aborted") follows if the request had not ended. Used as
    ``async with handle:`` it aborts on exit when the request is still running (for example
    when the consuming task is cancelled because its client disconnected).

    The first task that iterates the handle is the sink's reader: when the sink overflows
    (the reader stopped taking events), that task is cancelled unless it is done (it read
    the Finished and told its client) within ``SLOW_READER_GRACE_S`` seconds
    (``AsyncSink``)."""

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
        event = await self._sink.get()
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
