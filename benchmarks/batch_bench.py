"""Batch APIs side by side with interactive traffic, in one run (docs/USAGE.md, Batches).

1. **Hit rate and wall time** (the tiny model by default): N questions over D shared documents
   (~1.5k tokens each), in random order, with a KV budget of about four documents: once as one
   Message Batch, once sent interactively at concurrency 16 in the same order, and (the hit
   rate's reference) interactively sorted by document. Reports each run's wall time, hit
   rate (cached / prompt tokens) and the batch's ratios.
2. **Wall time on the default model**: a smaller sample of the same shape (``--real-*``).
3. **Interactive TTFT under a batch** (the default model): one ~500-token request a second,
   alone and while a large batch runs (the batch is cancelled afterwards); TTFT p50 ratio.

    python -m benchmarks.batch_bench [--quick] [--out benchmarks/out]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp

from benchmarks.launch import ServerProcess, bench_spec, tenant_key
from benchmarks.report import machine_info, save_report

KEY = {"x-api-key": tenant_key("default"), "anthropic-version": "2023-06-01",
       "content-type": "application/json"}
MODEL = "claude-bench"


def documents(count: int, words: int) -> list[str]:
    rng = random.Random(3)
    vocab = ("block tree prefix cache tenant window page token model query answer shared "
             "pinned evict radix kernel batch group replica prompt system").split()
    return [f"Document {d}. " + " ".join(rng.choice(vocab) for _ in range(words))
            for d in range(count)]


def message(doc: str, question: int, max_tokens: int = 2) -> dict:
    return {"model": MODEL, "max_tokens": max_tokens, "temperature": 0.0, "system": doc,
            "messages": [{"role": "user", "content": f"Question {question}: what is it?"}]}


def workload(docs: list[str], questions: int) -> list[tuple[str, dict]]:
    pairs = [(d, q) for d in range(len(docs)) for q in range(questions)]
    random.Random(11).shuffle(pairs)
    return [(f"d{d}-q{q}", message(docs[d], q)) for d, q in pairs]


def by_document(item: tuple[str, dict]) -> tuple[int, int]:
    """``d<doc>-q<question>`` as numbers: the requests sorted by document."""
    doc, question = item[0][1:].split("-q")
    return int(doc), int(question)


async def bytes_per_token(base: str) -> int:
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/v1/cache/stats", headers=KEY) as r:
            return (await r.json())["capacity"]["bytes_per_token"]


async def run_batch(base: str, items: list[tuple[str, dict]]) -> tuple[float, float]:
    """(wall seconds, hit rate) of ``items`` as one Message Batch."""
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as http:
        body = {"requests": [{"custom_id": cid, "params": p} for cid, p in items]}
        async with http.post(base + "/v1/messages/batches", headers=KEY, json=body) as r:
            batch = await r.json()
        while batch["processing_status"] != "ended":
            await asyncio.sleep(0.2)
            async with http.get(f"{base}/v1/messages/batches/{batch['id']}", headers=KEY) as r:
                batch = await r.json()
        wall = time.perf_counter() - started
        async with http.get(batch["results_url"], headers=KEY) as r:
            lines = [json.loads(x) for x in (await r.text()).splitlines()]
    usages = [x["result"]["message"]["usage"] for x in lines if x["result"]["type"] == "succeeded"]
    return wall, hit_rate(usages)


async def run_interactive(base: str, items: list[tuple[str, dict]],
                          concurrency: int = 16) -> tuple[float, float]:
    started = time.perf_counter()
    queue = list(items)
    usages: list[dict] = []

    async def worker(http):
        while queue:
            _, params = queue.pop(0)
            async with http.post(base + "/v1/messages", headers=KEY, json=params) as r:
                usages.append((await r.json())["usage"])
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    return time.perf_counter() - started, hit_rate(usages)


def hit_rate(usages: list[dict]) -> float:
    read = sum(u["cache_read_input_tokens"] for u in usages)
    total = sum(u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
                + u["input_tokens"] for u in usages)
    return read / total if total else 0.0


async def side_by_side(tiny: bool, doc_count: int, questions: int, words: int,
                       docs_in_kv: float) -> dict:
    """The batch and interactive runs of one workload, each on a fresh server whose KV holds
    about ``docs_in_kv`` documents."""
    docs = documents(doc_count, words)
    items = workload(docs, questions)
    probe = ServerProcess(bench_spec(tiny=tiny, kv_cache_gb=0.05)).start()
    try:
        per_token = await bytes_per_token(probe.base_url)
        async with aiohttp.ClientSession() as http:
            async with http.post(probe.base_url + "/v1/messages/count_tokens", headers=KEY,
                                 json={k: v for k, v in message(docs[0], 0).items()
                                       if k in ("model", "system", "messages")}) as r:
                doc_tokens = (await r.json())["input_tokens"]
    finally:
        probe.stop()
    budget = docs_in_kv * doc_tokens * per_token / 2**30
    result = {"documents": doc_count, "questions": questions, "requests": len(items),
              "doc_tokens": doc_tokens, "kv_cache_gb": budget}
    runs = (("batch", run_batch, items), ("interactive_c16", run_interactive, items),
            ("interactive_sorted", run_interactive, sorted(items, key=by_document)))
    for name, run, ordered in runs:
        server = ServerProcess(bench_spec(tiny=tiny, kv_cache_gb=budget)).start()
        try:
            wall, rate = await run(server.base_url, ordered)
        finally:
            server.stop()
        result[name] = {"wall_s": wall, "hit_rate": rate}
        print(("tiny" if tiny else "default"), name, json.dumps(result[name]), flush=True)
    result["wall_ratio"] = result["batch"]["wall_s"] / result["interactive_c16"]["wall_s"]
    result["hit_rate_vs_sorted"] = result["batch"]["hit_rate"] / max(
        result["interactive_sorted"]["hit_rate"], 1e-9)
    return result


async def ttft_under_batch(samples: int, batch_requests: int) -> dict:
    """Interactive TTFT p50 (one ~500-token request a second) alone and with a batch running."""
    server = ServerProcess(bench_spec(kv_cache_gb=0.5)).start()
    try:
        alone = await ttfts(server.base_url, samples, seed=0)
        docs = documents(40, 80)           # small: 5,000 of them stay under the body limit
        body = {"requests": [{"custom_id": f"b{i}", "params": message(docs[i % 40], i, 8)}
                             for i in range(batch_requests)]}
        async with aiohttp.ClientSession() as http:
            async with http.post(server.base_url + "/v1/messages/batches", headers=KEY,
                                 json=body) as r:
                batch = await r.json()
            await asyncio.sleep(5)                       # the batch is running
            busy = await ttfts(server.base_url, samples, seed=1)
            async with http.post(f"{server.base_url}/v1/messages/batches/{batch['id']}/cancel",
                                 headers=KEY) as r:
                await r.read()
    finally:
        server.stop()
    p50 = statistics.median
    return {"samples": samples, "batch_requests": batch_requests,
            "ttft_p50_alone_ms": 1000 * p50(alone), "ttft_p50_with_batch_ms": 1000 * p50(busy),
            "ratio": p50(busy) / p50(alone)}


async def ttfts(base: str, samples: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    out = []
    async with aiohttp.ClientSession() as http:
        for k in range(samples):
            words = " ".join(str(rng.randrange(10**6)) for _ in range(120))   # ~500 tokens
            params = {"model": MODEL, "max_tokens": 1, "temperature": 0.0, "stream": True,
                      "messages": [{"role": "user", "content": words}]}
            started = time.perf_counter()
            async with http.post(base + "/v1/messages", headers=KEY, json=params) as r:
                async for line in r.content:
                    if line.startswith(b"data:") and b"content_block_delta" in line:
                        out.append(time.perf_counter() - started)
                        break
            await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - started)))
    return out


async def run(quick: bool) -> dict:
    tiny = await side_by_side(True, 20, 25 if quick else 50, 1300, 4)
    real = await side_by_side(False, 6, 4 if quick else 8, 300, 2)
    ttft = await ttft_under_batch(6 if quick else 12, 5000)
    return {"machine": machine_info(), "tiny": tiny, "default_model": real, "ttft": ttft}


def markdown(report: dict) -> str:
    lines = ["| run | requests | batch wall (s) | interactive c16 wall (s) | wall ratio | "
             "batch hit rate | c16 hit rate | sorted hit rate | batch vs sorted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in ("tiny", "default_model"):
        r = report[name]
        lines.append(f"| {name} ({r['documents']} docs x {r['questions']}, "
                     f"{r['doc_tokens']} tok each) | {r['requests']} | "
                     f"{r['batch']['wall_s']:.1f} | {r['interactive_c16']['wall_s']:.1f} | "
                     f"{r['wall_ratio']:.2f}x | {r['batch']['hit_rate']:.3f} | "
                     f"{r['interactive_c16']['hit_rate']:.3f} | "
                     f"{r['interactive_sorted']['hit_rate']:.3f} | "
                     f"{r['hit_rate_vs_sorted']:.2f}x |")
    t = report["ttft"]
    lines.append(f"\nInteractive TTFT p50: {t['ttft_p50_alone_ms']:.0f} ms alone, "
                 f"{t['ttft_p50_with_batch_ms']:.0f} ms with a {t['batch_requests']}-request "
                 f"batch running ({t['ratio']:.2f}x).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer questions and samples")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.quick))
    path = save_report(report, args.out, "batch_bench", "quick" if args.quick else "default",
                       sys.argv[1:] if argv is None else argv)
    print(markdown(report))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
