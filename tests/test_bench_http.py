"""The benchmark HTTP runner against a scripted SSE endpoint; summary statistics."""
import asyncio
import json
from types import SimpleNamespace

import pytest
from aiohttp import web

from benchmarks.http_runner import ClientConfig, dispatch_in_arrival_order, run_workload, warm_up
from benchmarks.summary import percentile, summarize
from benchmarks.workloads import make_workloads


def sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def scripted_app(seen: list, admin_status: int = 200) -> web.Application:
    """Answers /v1/messages like the Anthropic stream: 10 prompt tokens, 4 read, 3 output;
    the admin endpoints (stats, flush) answer ``admin_status``."""
    stats = {"blocks": {"total": 100, "free": 90, "cached": 6},
             "tokens": {"prompt": 0, "cache_read": 0}}

    async def messages(request):
        body = await request.json()
        seen.append((request.headers.get("x-api-key"), body))
        stats["tokens"]["prompt"] += 10
        stats["tokens"]["cache_read"] += 4
        response = web.StreamResponse()
        await response.prepare(request)
        usage = {"input_tokens": 5, "cache_read_input_tokens": 4,
                 "cache_creation_input_tokens": 1, "output_tokens": 1}
        await response.write(sse("message_start", {"type": "message_start",
                                                   "message": {"usage": usage}}))
        for text in ("a", "b"):
            await response.write(sse("content_block_delta", {
                "type": "content_block_delta", "delta": {"type": "text_delta", "text": text}}))
        await response.write(sse("message_delta", {"type": "message_delta",
                                                   "usage": {**usage, "output_tokens": 3}}))
        await response.write(sse("message_stop", {"type": "message_stop"}))
        return response

    async def cache_stats(request):
        return web.json_response(stats, status=admin_status)

    async def flush(request):
        return web.json_response({"freed_blocks": 0}, status=admin_status)

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    app.router.add_get("/v1/cache/stats", cache_stats)
    app.router.add_post("/v1/cache/flush", flush)
    return app


async def test_runner_reads_usage_and_timings_from_the_stream(aiohttp_server):
    seen = []
    server = await aiohttp_server(scripted_app(seen))
    workload = make_workloads(quick=True, seed=0, names=("agents",))[0]
    keys = {r.tenant: f"key-{r.tenant}" for r in workload.requests}
    cfg = ClientConfig(str(server.make_url("")).rstrip("/"), api_keys=keys, concurrency=2)
    summary = await run_workload(cfg, workload)
    n = len(workload.requests)
    assert summary["requests"] == n and summary["errors"] == 0
    assert summary["prompt_tokens"] == 10 * n
    assert summary["cache_read_tokens"] == 4 * n and summary["prefill_tokens"] == 6 * n
    assert summary["hit_rate"] == pytest.approx(0.4)
    assert summary["server_hit_rate"] == pytest.approx(0.4)
    assert summary["output_tokens"] == 3 * n
    assert summary["ttft_ms"]["p50"] is not None and summary["itl_ms"]["mean"] is not None
    assert summary["kv_blocks_peak"] == 10
    assert {key for key, _ in seen} == set(keys.values())
    assert all(body["stream"] and body["tools"] for _, body in seen)


async def test_session_turns_are_sent_in_order(aiohttp_server):
    seen = []
    server = await aiohttp_server(scripted_app(seen))
    workload = make_workloads(quick=True, seed=1, names=("multi_turn",))[0]
    cfg = ClientConfig(str(server.make_url("")).rstrip("/"), concurrency=3)
    await run_workload(cfg, workload)
    by_first_message = {}
    for _, body in seen:
        first = body["messages"][0]["content"]
        by_first_message.setdefault(first, []).append(len(body["messages"]))
    for lengths in by_first_message.values():
        assert lengths == sorted(lengths)


async def test_dispatch_keeps_arrival_order_concurrency_and_session_turns():
    order = [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("d", 1), ("b", 2), ("e", 1)]
    requests = [SimpleNamespace(session=s, turn=t) for s, t in order]
    started, running, peak, done = [], set(), [0], set()

    async def run_one(req):
        if req.turn == 2:
            assert (req.session, 1) in done          # its previous turn was answered
        started.append((req.session, req.turn))
        running.add(req.session)
        peak[0] = max(peak[0], len(running))
        await asyncio.sleep(0.02 if req.session == "a" else 0.005)
        running.discard(req.session)
        done.add((req.session, req.turn))

    await dispatch_in_arrival_order(requests, 2, run_one)
    assert started == order                          # never reordered
    assert peak[0] == 2                              # concurrency used, never exceeded
    assert done == set(order)


async def test_refused_flush_fails_the_run_and_refused_stats_report_no_blocks(aiohttp_server):
    server = await aiohttp_server(scripted_app([], admin_status=403))
    workload = make_workloads(quick=True, seed=0, names=("control",))[0]
    cfg = ClientConfig(str(server.make_url("")).rstrip("/"))
    with pytest.raises(RuntimeError, match="flush refused: HTTP 403"):
        await run_workload(cfg, workload)
    summary = await run_workload(cfg, workload, flush_first=False)
    assert summary["errors"] == 0 and summary["kv_blocks_peak"] is None
    assert summary["server_hit_rate"] is None


def test_percentiles_interpolate_and_summary_counts_only_successes():
    assert percentile([1, 2, 3, 4, 5], 50) == 3
    assert percentile([0, 10], 95) == pytest.approx(9.5)
    assert percentile([], 50) is None
    ok = {"ok": True, "prompt_tokens": 100, "cache_read_tokens": 75, "output_tokens": 4,
          "ttft_s": 0.2, "itl_s": 0.01}
    bad = {"ok": False, "prompt_tokens": 0, "cache_read_tokens": 0, "output_tokens": 0,
           "ttft_s": None, "itl_s": None, "error": "HTTP 529"}
    s = summarize([ok, ok, bad], wall_s=2.0)
    assert (s["requests"], s["errors"], s["prefill_tokens"]) == (3, 1, 50)
    assert s["hit_rate"] == 0.75 and s["ttft_ms"]["p50"] == 200.0
    assert s["throughput"]["requests_per_s"] == 1.0 and s["error_samples"] == ["HTTP 529"]


async def test_warm_up_sends_one_short_request_with_the_tenants_key(aiohttp_server):
    seen = []
    server = await aiohttp_server(scripted_app(seen))
    cfg = ClientConfig(str(server.make_url("")).rstrip("/"), api_keys={"acme": "key-acme"})
    result = await warm_up(cfg, "acme")
    assert result.ok and result.output_tokens == 3
    (key, body), = seen
    assert key == "key-acme" and body["max_tokens"] == 2 and body["stream"] is True
