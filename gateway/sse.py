"""Server-sent events over an aiohttp StreamResponse.

``open_stream`` sends the 200 and headers; ``send_event`` writes one event. A write to a
client that went away raises ``ConnectionResetError`` (or cancels the handler, with
``handler_cancellation=True``); callers let it propagate so the request is aborted.
"""
from __future__ import annotations

import json

from aiohttp import web


async def open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers={
        "Content-Type": "text/event-stream; charset=utf-8",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
    })
    await response.prepare(request)
    return response


async def send_event(response: web.StreamResponse, data: dict | str, event: str | None = None
                     ) -> None:
    """One SSE frame: ``event: NAME`` (when given) and ``data: JSON`` (or raw text)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    frame = (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
    await response.write(frame.encode("utf-8"))
