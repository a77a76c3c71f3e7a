"""Slow clients over real loopback HTTP:

- a body that arrives too slowly is answered 408 in the API's envelope after
  ``[server] body_timeout_s``, and other tenants are served meanwhile;
- a streaming client that reads nothing leaves its events unsent: past
  ``[server] max_unsent_events`` the request is ended (its blocks go back at once, the
  outcome is ``error_timeout``) and, its handler being stuck, the connection is closed.
"""
from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import aiohttp
import pytest

from radixgate.runtime.engine import handle as handle_module
from radixgate.runtime.engine.api import Finished, FinishReason, TextDelta, Usage
from radixgate.runtime.engine.handle import SLOW_READER_GRACE_S, AsyncSink, RequestHandle
from tests.support import client as c
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

SPEC = ServerSpec(tenants=("slow_one", "slow_two"), kv_cache_gb=0.004, max_model_len=4096,
                  extra_args=("--body-timeout-s", "1", "--max-unsent-events", "16",
                              "--stream-send-buffer-bytes", "16384"))
SLOW, OTHER = tenant_key("slow_one"), tenant_key("slow_two")
LONG = 2000    # tokens: far more SSE bytes than the socket buffers of a client that reads nothing


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


def host_port(base_url: str) -> tuple[str, int]:
    host, port = base_url.removeprefix("http://").split(":")
    return host, int(port)


def request_head(path: str, key: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nx-api-key: {key}\r\n"
            "anthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n"
            f"content-length: {length}\r\nconnection: close\r\n\r\n").encode()


# ---------------------------------------------------------------- the sink's bound, alone

def finished() -> Finished:
    return Finished(FinishReason.ABORTED, Usage())


async def test_a_full_sink_calls_its_overflow_once_drops_deltas_and_keeps_the_finished():
    overflows = []
    sink = AsyncSink(asyncio.get_running_loop(), 3, lambda: overflows.append(1))
    handle = RequestHandle("r1", sink, lambda _: None)
    for i in range(10):
        sink.put(TextDelta(f"t{i}"))
    sink.put(finished())
    await asyncio.sleep(0)
    events = [event async for event in handle]
    assert overflows == [1] and sink.overflowed
    assert [e.text for e in events[:-1]] == ["t0", "t1", "t2"]
    assert isinstance(events[-1], Finished) and sink.unsent == 0


async def test_a_reader_that_keeps_up_never_overflows():
    sink = AsyncSink(asyncio.get_running_loop(), 2, lambda: pytest.fail("overflowed"))
    handle = RequestHandle("r1", sink, lambda _: None)
    for i in range(50):
        sink.put(TextDelta(str(i)))
        await asyncio.sleep(0)
        assert (await handle.__anext__()).text == str(i)
    assert not sink.overflowed


async def test_a_consumer_stuck_after_the_overflow_is_cancelled_after_the_grace(monkeypatch):
    monkeypatch.setattr(handle_module, "SLOW_READER_GRACE_S", 0.05)
    sink = AsyncSink(asyncio.get_running_loop(), 1, lambda: None)
    handle = RequestHandle("r1", sink, lambda _: None)

    async def consume_then_block():
        await handle.__anext__()
        await asyncio.sleep(60)        # a write to a client that reads nothing

    consumer = asyncio.create_task(consume_then_block())
    sink.put(TextDelta("a"))
    await asyncio.sleep(0.01)
    sink.put(TextDelta("b"))
    sink.put(TextDelta("c"))           # overflows: "b" is still unsent
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await consumer


# ---------------------------------------------------------------- over HTTP

@pytest.mark.parametrize("path", [c.ANTHROPIC_PATH, c.CHAT_PATH])
async def test_a_body_sent_too_slowly_gets_408_while_others_are_served(http, server, path):
    reader, writer = await asyncio.open_connection(*host_port(server.base_url))
    writer.write(request_head(path, SLOW, 1000) + b'{"model": "claude-3-x", "max_tok')
    await writer.drain()
    started = time.monotonic()
    build = c.anthropic_body if path == c.ANTHROPIC_PATH else c.chat_body
    status, answer = await c.post_json(http, server.base_url + path, OTHER, build("hello"))
    assert status == 200, answer
    async with asyncio.timeout(8):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        body = await reader.readexactly(length)
    waited = time.monotonic() - started
    writer.close()
    assert head.startswith(b"HTTP/1.1 408"), head
    assert 0.8 <= waited < 8, waited
    assert c.check_error_envelope(c.api_of(path), 408, body.decode()) is None
    assert "body_timeout_s" in json.loads(body)["error"]["message"]


def open_unread_stream(base_url: str, body: dict) -> socket.socket:
    """Sends a streaming request on a socket with a tiny receive buffer and never reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(host_port(base_url))
    data = json.dumps(body).encode()
    sock.sendall(request_head(c.ANTHROPIC_PATH, SLOW, len(data)) + data)
    return sock


def read_until_closed(sock: socket.socket, timeout_s: float) -> str:
    sock.settimeout(timeout_s)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    return b"".join(chunks).decode("utf-8", errors="replace")


async def outcome_count(http: aiohttp.ClientSession, base_url: str, outcome: str) -> float:
    async with http.get(base_url + "/metrics", headers=c.headers(ADMIN_KEY)) as r:
        text = await r.text()
    pattern = rf'radixgate_requests_total\{{api="anthropic",outcome="{outcome}",tenant="slow_one"\}} ([0-9.e+]+)'
    return sum(float(m) for m in re.findall(pattern, text))


async def test_a_client_that_reads_nothing_is_cut_off_and_its_blocks_return(http, server):
    timeouts_before = await outcome_count(http, server.base_url, "error_timeout")
    sock = open_unread_stream(server.base_url, c.anthropic_body(
        "tell a very long story", max_tokens=LONG, stream=True))
    try:
        started = time.monotonic()
        running_seen = False
        while True:    # the request runs, then is ended without the client reading a byte
            _, stats = await c.get_json(http, server.base_url + "/v1/cache/stats", ADMIN_KEY)
            running_seen |= stats["requests"]["running"] >= 1
            if running_seen and stats["requests"]["running"] == 0:
                break
            assert time.monotonic() - started < 120, stats
            await asyncio.sleep(0.1)
        stats = await c.wait_quiescent(http, server.base_url, ADMIN_KEY)
        assert c.block_accounting_violation(stats) is None
        assert await c.integrity_violation(http, server.base_url, ADMIN_KEY) is None
        await asyncio.sleep(SLOW_READER_GRACE_S + 1)      # the stuck handler is cancelled
        raw = await asyncio.to_thread(read_until_closed, sock, 30)
    finally:
        sock.close()
    assert raw.startswith("HTTP/1.1 200"), raw[:200]
    assert "message_stop" not in raw                       # the stream did not complete
    assert raw.count("event: content_block_delta") < LONG - 100    # text was dropped
    assert await outcome_count(http, server.base_url, "error_timeout") == timeouts_before + 1
    async with http.post(server.base_url + c.ANTHROPIC_PATH, headers=c.headers(OTHER),
                         json=c.anthropic_body("still serving?", stream=True)) as r:
        assert c.check_answer(c.ANTHROPIC_PATH, True, r.status, await r.text(), 8) is None
