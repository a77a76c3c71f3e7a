"""Drive a running radixgate server over HTTP with a workload, streaming, with concurrency.

Requests go out in the workload's arrival order (the order the memory sweep replays), at
most ``concurrency`` in flight; a session's next turn waits until its previous one was
answered (the client sends it after reading the reply), holding back the requests behind it
as a queue at the client would. Every request streams (``POST /v1/messages`` with
``stream: true``, or ``/v1/chat/completions`` with ``--api openai``) so time to first
token and inter-token latency are measured on the client: radixgate sends the 200 and the
first SSE event only once the first output token exists (radixgate/gateway/anthropic/messages.py), so
TTFT = time to the first event; ITL = (last event - first event) / (output tokens - 1),
which does not depend on how the server groups text into deltas (a tool call's text is
held back until it closes). Prompt and cached token counts
come from each response's usage; KV blocks in use from ``GET /v1/cache/stats``, sampled
while the workload runs.

Run against a server you started: ``python -m benchmarks.http_runner --url http://127.0.0.1:8080``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import aiohttp

from benchmarks.bodies import anthropic_body, openai_body
from benchmarks.summary import summarize
from benchmarks.workloads import HTTP_FULL, ChatRequest, Workload, make_workloads


@dataclass
class RequestResult:
    session: str
    ok: bool
    status: int = 0
    error: str = ""
    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    itl_s: float | None = None       # mean gap between output tokens after the first
    latency_s: float = 0.0


@dataclass
class ClientConfig:
    base_url: str
    model: str = "claude-3-5-haiku-latest"
    api: str = "anthropic"                          # or "openai"
    concurrency: int = 4
    api_keys: dict[str, str] = field(default_factory=dict)   # tenant -> key
    admin_key: str | None = None
    cache_control: bool = False
    timeout_s: float = 1800.0


def _headers(key: str | None) -> dict[str, str]:
    h = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    if key:
        h["x-api-key"] = key
        h["authorization"] = f"Bearer {key}"
    return h


async def _sse_events(response: aiohttp.ClientResponse):
    """(event name or None, parsed data) for each SSE event; stops at ``[DONE]``."""
    name, data = None, []
    async for raw in response.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            text = "\n".join(data)
            if text == "[DONE]":
                return
            yield name, json.loads(text)
            name, data = None, []


def _anthropic_usage(result: RequestResult, usage: dict) -> None:
    read = usage.get("cache_read_input_tokens") or 0
    created = usage.get("cache_creation_input_tokens") or 0
    if "input_tokens" in usage:
        result.prompt_tokens = usage["input_tokens"] + read + created
        result.cache_read_tokens = read
    if usage.get("output_tokens"):
        result.output_tokens = usage["output_tokens"]


def _openai_usage(result: RequestResult, usage: dict) -> None:
    result.prompt_tokens = usage.get("prompt_tokens", 0)
    details = usage.get("prompt_tokens_details") or {}
    result.cache_read_tokens = details.get("cached_tokens") or 0
    result.output_tokens = usage.get("completion_tokens", 0)


async def send(http: aiohttp.ClientSession, cfg: ClientConfig, req: ChatRequest) -> RequestResult:
    """One streamed request; timings from the client's clock."""
    result = RequestResult(req.session, ok=False)
    if cfg.api == "anthropic":
        path, body = "/v1/messages", anthropic_body(req, cfg.model, True, cfg.cache_control)
    else:
        path, body = "/v1/chat/completions", openai_body(req, cfg.model, True)
    started = time.perf_counter()
    first = last = None
    try:
        async with http.post(cfg.base_url + path, json=body,
                             headers=_headers(cfg.api_keys.get(req.tenant))) as response:
            result.status = response.status
            if response.status != 200:
                result.error = (await response.text())[:300]
                return result
            async for name, data in _sse_events(response):
                now = time.perf_counter()
                if name == "error" or (cfg.api == "openai" and "error" in data):
                    result.error = json.dumps(data)[:300]
                    return result
                first = first or now
                last = now
                if cfg.api == "anthropic":
                    usage = (data.get("message") or {}).get("usage") or data.get("usage")
                    if usage:
                        _anthropic_usage(result, usage)
                elif data.get("usage"):
                    _openai_usage(result, data["usage"])
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.latency_s = time.perf_counter() - started
    result.ttft_s = None if first is None else first - started
    if first is not None and result.output_tokens > 1:
        result.itl_s = (last - first) / (result.output_tokens - 1)
    result.ok = True
    return result


async def warm_up(cfg: ClientConfig, tenant: str) -> RequestResult:
    """One short unmeasured request, so that the first measured one does not pay a fresh
    server's first-call costs (thread pools, the first forward pass). ``run_workload``
    flushes the cache before measuring, so it leaves nothing behind."""
    req = ChatRequest("warm-up", tenant, "You are a terse assistant.",
                      ({"role": "user", "content": "Say hello."},), max_tokens=2)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)) as http:
        return await send(http, cfg, req)


async def cache_stats(http: aiohttp.ClientSession, cfg: ClientConfig) -> dict | None:
    """The server's cache stats; None when it refuses them (e.g. no admin key)."""
    async with http.get(cfg.base_url + "/v1/cache/stats", headers=_headers(cfg.admin_key)) as r:
        return await r.json() if r.status == 200 else None


async def flush_cache(http: aiohttp.ClientSession, cfg: ClientConfig) -> None:
    """Empty the server's cache; raises if it refuses (a warm cache would inflate the next
    workload's hit rate)."""
    async with http.post(cfg.base_url + "/v1/cache/flush", headers=_headers(cfg.admin_key)) as r:
        body = await r.text()
        if r.status != 200:
            raise RuntimeError(f"cache flush refused: HTTP {r.status} {body[:200]}")


def blocks_used(stats: dict | None) -> int | None:
    """KV blocks in use (cached or running), None without stats."""
    blocks = (stats or {}).get("blocks")
    if not blocks or "total" not in blocks or "free" not in blocks:
        return None
    return int(blocks["total"]) - int(blocks["free"])


def _max(a: int | None, b: int | None) -> int | None:
    return a if b is None else b if a is None else max(a, b)


async def _sample_blocks(http, cfg: ClientConfig, peak: list, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            peak[0] = _max(peak[0], blocks_used(await cache_stats(http, cfg)))
        except (aiohttp.ClientError, ValueError):
            pass
        try:
            await asyncio.wait_for(stop.wait(), timeout=0.5)
        except asyncio.TimeoutError:
            pass


async def run_workload(cfg: ClientConfig, workload: Workload, progress=None,
                       flush_first: bool = True) -> dict:
    """Send every request of ``workload``; returns the summary (see ``benchmarks.summary``)
    with each request's result under ``results``, in the workload's order."""
    timeout = aiohttp.ClientTimeout(total=cfg.timeout_s)
    connector = aiohttp.TCPConnector(limit=cfg.concurrency + 2)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        if flush_first:
            await flush_cache(http, cfg)
        before = await cache_stats(http, cfg)
        results: list[dict | None] = [None] * len(workload.requests)
        peak, stop = [None], asyncio.Event()

        async def one(indexed: tuple[int, ChatRequest]) -> None:
            index, req = indexed
            results[index] = asdict(await send(http, cfg, req))
            if progress is not None:
                progress.update(1)

        sampler = asyncio.create_task(_sample_blocks(http, cfg, peak, stop))
        started = time.perf_counter()
        await dispatch_in_arrival_order(list(enumerate(workload.requests)), cfg.concurrency,
                                        one, session=lambda x: x[1].session)
        wall_s = time.perf_counter() - started
        stop.set()
        await sampler
        after = await cache_stats(http, cfg)
    summary = summarize(results, wall_s)
    summary["kv_blocks_peak"] = _max(peak[0], blocks_used(after))
    summary["kv_blocks_cached_after"] = ((after or {}).get("blocks") or {}).get("cached")
    summary["server_hit_rate"] = _hit_rate_delta(before or {}, after or {})
    summary["results"] = results
    return summary


async def dispatch_in_arrival_order(requests: list, concurrency: int, run_one,
                                    session=lambda req: req.session) -> None:
    """``await run_one(req)`` for each request, started in list order with at most
    ``concurrency`` running; a request starts only after its session's (``session(req)``)
    previous one ended. When a ``run_one`` raises, no further request starts, those still
    running are cancelled, and the exception propagates."""
    slots = asyncio.Semaphore(concurrency)
    last_of_session: dict[str, asyncio.Task] = {}
    tasks: list[asyncio.Task] = []

    async def run(req) -> None:
        try:
            await run_one(req)
        finally:
            slots.release()

    def failed() -> bool:
        return any(t.done() and not t.cancelled() and t.exception() for t in tasks)

    try:
        for req in requests:
            previous = last_of_session.get(session(req))
            if previous is not None:
                await asyncio.wait([previous])
            await slots.acquire()
            if failed():
                slots.release()
                break
            task = asyncio.create_task(run(req))
            last_of_session[session(req)] = task
            tasks.append(task)
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _hit_rate_delta(before: dict, after: dict) -> float | None:
    tb, ta = before.get("tokens") or {}, after.get("tokens") or {}
    prompt = ta.get("prompt", 0) - tb.get("prompt", 0)
    read = ta.get("cache_read", 0) - tb.get("cache_read", 0)
    return read / prompt if prompt > 0 else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Drive a running radixgate server")
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--full", action="store_true", help="run_all's full HTTP sizes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api", choices=("anthropic", "openai"), default="anthropic")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--admin-key", default=None)
    parser.add_argument("--workload", action="append", help="only these workloads")
    args = parser.parse_args(argv)
    cfg = ClientConfig(args.url, api=args.api, concurrency=args.concurrency,
                       admin_key=args.admin_key)
    scale = HTTP_FULL if args.full else None
    for workload in make_workloads(quick=not args.full, seed=args.seed, scale=scale):
        if args.workload and workload.name not in args.workload:
            continue
        summary = asyncio.run(run_workload(cfg, workload))
        summary.pop("results")
        print(json.dumps({"workload": workload.name, **summary}))


if __name__ == "__main__":
    main()
