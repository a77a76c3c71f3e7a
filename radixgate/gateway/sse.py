"""Server-sent events over an aiohttp StreamResponse.

``open_stream`` sends the 200 and headers; ``send_event`` writes one event. A write to a
client that went away raises ``ConnectionResetError`` (or cancels the handler, with
``handler_cancellation=True``); callers let it propagate so the request is aborted.
"""
from __future__ import annotations

import json
import socket

from aiohttp import web

from radixgate.gateway.http_util import state_of


async def open_stream(request: web.Request) -> web.StreamResponse:
    """Sends the 200. The connection's kernel send buffer is capped at
    ``[server] stream_send_buffer_bytes`` (Linux autotunes it up to 4 MB on loopback): a
    client that reads nothing then blocks the handler's writes soon, so its unsent events
    pile up in the request's queue, where ``max_unsent_events`` bounds them."""
    _cap_send_buffer(request, state_of(request).config.server.stream_send_buffer_bytes)
    response = web.StreamResponse(status=200, headers={
        "Content-Type": "text/event-stream; charset=utf-8",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
    })
    await response.prepare(request)
    return response


def _cap_send_buffer(request: web.Request, size: int) -> None:
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if size > 0 and sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


async def send_event(response: web.StreamResponse, data: dict | str, event: str | None = None
                     ) -> None:
    """One SSE frame: ``event: NAME`` (when given) and ``data: JSON`` (or raw text)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    frame = (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
    await response.write(frame.encode("utf-8"))
