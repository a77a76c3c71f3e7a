"""Graceful drain (docs/ARCHITECTURE.md section 5): SIGTERM while requests run stops
admitting, lets every request finish or cleanly aborts it (a complete answer, an error in
its envelope, or a stream that ends with an error event — never a torn connection), and the
process exits with code 0 within the grace period."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from tests.support import client as c
from tests.support.server import ADMIN_KEY, ServerProcess, ServerSpec, tenant_key

GRACE_S = 4.0
SPEC = ServerSpec(shutdown_grace_s=GRACE_S, kv_cache_gb=0.004)
DRAIN_STATUSES = {"anthropic": {503, 529}, "openai": {503}}


@pytest.fixture
def server():
    proc = ServerProcess(SPEC).start()
    yield proc
    proc.kill()


async def one_request(session, base, i: int, late: bool = False) -> tuple[str, str | None]:
    """-> (outcome, violation): 'ok', 'drained' (clean refusal or abort), 'refused' (the
    listener is closed: only clean for a request sent after SIGTERM, ``late``)."""
    path = (c.ANTHROPIC_PATH, c.CHAT_PATH)[i % 2]
    stream = i % 3 != 0
    build = c.anthropic_body if path == c.ANTHROPIC_PATH else c.chat_body
    body = build(f"request {i} " + "tell me a long story " * 10, max_tokens=48 + 8 * (i % 20),
                 stream=stream)
    try:
        async with session.post(base + path, headers=c.headers(tenant_key("acme")),
                                json=body) as resp:
            text = await resp.text()
    except aiohttp.ClientError as e:
        if late:
            return "refused", None        # sent after SIGTERM: no connection is clean too
        return "torn", f"request {i} ({path}, stream={stream}) torn: {type(e).__name__}: {e}"
    api = c.api_of(path)
    if resp.status in DRAIN_STATUSES[api]:
        problem = _envelope_problem(api, text)
        return "drained", problem
    problem = c.check_answer(path, stream, resp.status, text, body["max_tokens"])
    if problem:
        return "bad", f"request {i}: {problem}"
    return ("drained" if c.stream_ended_in_error(text) else "ok"), None


def _envelope_problem(api: str, text: str) -> str | None:
    body = json.loads(text)
    ok = (body.get("type") == "error" if api == "anthropic" else True) and "error" in body
    return None if ok else f"drain refusal outside the {api} envelope: {text[:200]}"


async def wait_running(session, base: str, count: int, timeout_s: float = 60) -> None:
    """Until the server reports at least ``count`` running requests (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status, stats = await c.get_json(session, base + "/v1/cache/stats", ADMIN_KEY)
        if status == 200 and stats["requests"]["running"] >= count:
            return
        await asyncio.sleep(0.02)


async def test_sigterm_under_load_finishes_or_cleanly_aborts_every_request_and_exits_0(server):
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(one_request(session, server.base_url, i)) for i in range(24)]
        await wait_running(session, server.base_url, 4)
        sent_at = time.monotonic()
        server.send_sigterm()
        late = asyncio.create_task(one_request(session, server.base_url, 99, late=True))
        results = await asyncio.wait_for(asyncio.gather(*tasks, late), timeout=GRACE_S + 30)
        code = await asyncio.to_thread(server.wait, GRACE_S + 15)
        exited_after = time.monotonic() - sent_at
    violations = [v for _, v in results if v]
    outcomes = [o for o, _ in results]
    print("drain outcomes:", {o: outcomes.count(o) for o in set(outcomes)},
          f"exit {code} after {exited_after:.1f}s")
    assert violations == []
    assert outcomes.count("ok") + outcomes.count("drained") >= 24, outcomes
    assert code == 0, server.log_tail()
    assert exited_after <= GRACE_S + 10, f"exit took {exited_after:.1f}s"


async def test_during_the_drain_the_listener_stays_open_and_answers_503_with_retry_after(server):
    async with aiohttp.ClientSession() as session:
        body = c.anthropic_body("a long story " * 10, max_tokens=200)
        running = asyncio.create_task(session.post(server.base_url + c.ANTHROPIC_PATH,
                                                   headers=c.headers(tenant_key("acme")),
                                                   json=body))
        await wait_running(session, server.base_url, 1)
        server.send_sigterm()
        await asyncio.sleep(0.3)
        for path, build in ((c.ANTHROPIC_PATH, c.anthropic_body), (c.CHAT_PATH, c.chat_body)):
            async with session.post(server.base_url + path, headers=c.headers(tenant_key("acme")),
                                    json=build("late", max_tokens=2)) as late:
                assert late.status == 503, await late.text()
                assert int(late.headers["retry-after"]) >= 1
                assert _envelope_problem(c.api_of(path), await late.text()) is None
        async with session.get(server.base_url + "/health") as health:
            assert health.status == 503 and (await health.json())["status"] == "draining"
        first = await running
        assert first.status == 200                   # the running request finished
        first.release()
        code = await asyncio.to_thread(server.wait, GRACE_S + 15)
    assert code == 0, server.log_tail()
