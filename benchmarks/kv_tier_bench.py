"""The KV disk tier through the engine: hit rate under a small memory budget with and
without the tier, and time to first token from disk against recomputation.

1. Hit rate. The multi-turn conversation workload (``benchmarks.workloads.multi_turn``,
   rendered to token ids by ``benchmarks.traces``) is replayed request by request through
   the engine, back to back (a block still being written when its turn comes back is a
   miss), with the tiny model (the hit rate depends on the cache, not the weights) and 2
   output tokens: with unlimited memory, and at memory budgets of 5 / 10 / 25% of its
   working set (the blocks it holds with unlimited memory; never below its longest
   prompt), each with and without a disk tier (budget: twice the working set). Hit rate =
   cache_read / prompt tokens, from each request's usage.
2. TTFT. A 2k- and a 6k-token prompt on the real model: computed (cold), then evicted from
   memory into the tier and requested again (loaded). "warm": the record files are in the
   page cache, as right after they were written; "cold": flushed to the device and
   dropped from the page cache first (``posix_fadvise``, only our own files). The load
   speed is the loader's bytes over its time.

3. Decode. Single-stream decode over HTTP with the tier on against off, as ``make serve``
   runs it, after traffic that makes the tier write and load (``benchmarks.tier_decode``).

Run: ``python -m benchmarks.kv_tier_bench`` (``--quick``: smaller trace, 2k only, one decode
repetition).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.cli import size_parser, write_result

from radixgate.kv import BlockPool, CacheConfig, DiskTierConfig, RadixTree
from radixgate.runtime.engine.api import Request, SamplingParams
from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.engine.engine_config import EngineConfig

FRACTIONS = (0.05, 0.10, 0.25)
BLOCK = 16


def greedy(tokens, namespace: str, max_tokens: int = 2) -> Request:
    return Request(list(tokens), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                ignore_eos=True),
                   tenant="bench", namespace=namespace)


def conversation_trace(quick: bool) -> list[tuple[str, tuple[int, ...]]]:
    from benchmarks.traces import load_tokenizer, workload_trace
    from benchmarks.workloads import FULL, QUICK, make_workloads

    scale = replace(QUICK, chat_conversations=6, chat_turns=6) if quick else replace(
        FULL, chat_conversations=48)
    [workload] = make_workloads(scale=scale, names=("multi_turn",))
    return [(e.namespace, e.tokens) for e in workload_trace(workload, load_tokenizer())]


def working_set_blocks(trace) -> int:
    """Blocks the trace's prompts hold in a tree with unlimited memory."""
    pool = BlockPool(sum(-(-len(t) // BLOCK) for _, t in trace) + 1, BLOCK)
    tree = RadixTree(pool)
    for namespace, tokens in trace:
        found = tree.match(namespace, tokens)
        reuse = found.length - found.length % BLOCK
        table = list(found.blocks[:reuse // BLOCK])
        pool.decref_many(found.blocks[reuse // BLOCK:])
        table += pool.allocate(-(-len(tokens) // BLOCK) - len(table))
        tree.insert(namespace, tokens, table)
        pool.decref_many(table)
        tree.unlock(found.handle)
    return len(tree.held_blocks())


def replay(loaded, trace, num_blocks: int, disk_dir: str | None, disk_gb: float) -> dict:
    disk = DiskTierConfig(disk_dir, disk_gb) if disk_dir else DiskTierConfig()
    cache = CacheConfig(block_size=BLOCK, disk=disk)
    engine = Engine(loaded, EngineConfig(cache=cache, num_blocks=num_blocks,
                                         max_model_len=loaded.max_model_len)).start()
    prompt = read = 0
    started = time.perf_counter()
    try:
        for namespace, tokens in trace:
            usage = engine.generate(greedy(tokens, namespace)).usage
            prompt += usage.prompt_tokens
            read += usage.cache_read_tokens
        snap = engine.request_snapshot().result(timeout=60)
        engine.check_integrity().result(timeout=60)
    finally:
        engine.shutdown(grace_s=0)
    tier = snap.tier
    return {"hit_rate": read / prompt, "seconds": round(time.perf_counter() - started, 1),
            "disk_hit_tokens": snap.hit_tokens["disk"],
            "writes": tier.writes if tier else 0, "drops": dict(tier.drops) if tier else {}}


def wait_written(engine: Engine, timeout_s: float = 30) -> None:
    tier = engine.core.tier
    stop = time.monotonic() + timeout_s
    while tier is not None and tier.stats().staged_bytes and time.monotonic() < stop:
        time.sleep(0.005)


def hit_rates(quick: bool, fractions=FRACTIONS) -> dict:
    from radixgate.runtime.model.loader import load_model

    trace = conversation_trace(quick)
    loaded = load_model(tiny=True, max_model_len=8192)
    working = working_set_blocks(trace)
    longest = max(-(-len(t) // BLOCK) for _, t in trace) + 2
    per_block = loaded.config.num_layers * 2 * loaded.config.num_kv_heads * \
        loaded.config.head_dim * 4 * BLOCK
    disk_gb = 2 * working * per_block / 2**30
    out = {"requests": len(trace), "prompt_tokens": sum(len(t) for _, t in trace),
           "working_set_blocks": working, "points": []}
    out["unlimited"] = replay(loaded, trace, working + longest, None, 0)
    for fraction in fractions:
        blocks = max(int(fraction * working), longest)
        with tempfile.TemporaryDirectory() as folder:
            point = {"fraction": fraction, "blocks": blocks,
                     "memory_only": replay(loaded, trace, blocks, None, 0),
                     "with_tier": replay(loaded, trace, blocks, folder, disk_gb)}
        out["points"].append(point)
        print(f"  {fraction:.0%} ({blocks} blocks): memory only "
              f"{point['memory_only']['hit_rate']:.3f}, with tier "
              f"{point['with_tier']['hit_rate']:.3f}, unlimited "
              f"{out['unlimited']['hit_rate']:.3f}", flush=True)
    return out


def drop_page_cache(folder: str) -> None:
    """Write our record files to the device and drop them from the page cache (ours
    only: other processes' cached files are left alone)."""
    for path in Path(folder).glob("models/*/blocks/*/*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def ttft(quick: bool) -> dict:
    from radixgate.runtime.model.loader import load_model

    loaded = load_model("default", max_model_len=8192)
    out = {}
    for length in ((2048,) if quick else (2048, 6144)):
        with tempfile.TemporaryDirectory() as folder:
            out[str(length)] = ttft_one(loaded, length, folder)
            print(f"  {length} tokens: {out[str(length)]}", flush=True)
    return out


def ttft_one(loaded, length: int, folder: str) -> dict:
    vocab = loaded.config.vocab_size
    cache = CacheConfig(block_size=BLOCK, kv_cache_gb=0.6, disk=DiskTierConfig(folder, 2.0))
    engine = Engine(loaded, EngineConfig(cache=cache, max_model_len=8192)).start()
    try:
        prompts = {kind: [(k * 7919 + 13 * (i + 1)) % (vocab - 100) + 50 for k in range(length)]
                   for i, kind in enumerate(("warm", "cold"))}
        result = {}
        for kind, tokens in prompts.items():
            computed = engine.generate(greedy(tokens, "ns")).usage
            engine.evict(10**9).result(timeout=60)
            wait_written(engine, timeout_s=120)
            if kind == "cold":
                drop_page_cache(folder)
            before = engine.core.tier.stats()
            loaded_again = engine.generate(greedy(tokens, "ns")).usage
            after = engine.core.tier.stats()
            assert loaded_again.cache_read_tokens == length - 1, loaded_again
            load_bytes = after.load_bytes - before.load_bytes
            load_s = after.load_s - before.load_s
            result[kind] = {"recompute_ttft_s": round(computed.ttft_s, 3),
                            "disk_ttft_s": round(loaded_again.ttft_s, 3),
                            "speedup": round(computed.ttft_s / loaded_again.ttft_s, 1),
                            "load_mb": round(load_bytes / 1e6, 1),
                            "load_gb_per_s": round(load_bytes / load_s / 1e9, 2)}
        engine.check_integrity().result(timeout=60)
        return result
    finally:
        engine.shutdown(grace_s=0)


def main(argv: list[str] | None = None) -> None:
    parser = size_parser(__doc__, quick="smaller trace, 2k TTFT only, one decode repetition",
                         full="the full trace, 2k and 6k TTFT")
    parser.add_argument("--skip-ttft", action="store_true", help="no TTFT section")
    parser.add_argument("--skip-decode", action="store_true", help="no decode section")
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS),
                        help="memory budgets as fractions of the working set")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    print("hit rate (multi-turn trace, tiny model):", flush=True)
    result = {"hit_rates": hit_rates(args.quick, args.fractions)}
    if not args.skip_ttft:
        print("TTFT from disk vs recomputation (SmolLM2-135M):", flush=True)
        result["ttft"] = ttft(args.quick)
    if not args.skip_decode:
        from benchmarks.tier_decode import run as tier_decode
        print("single-stream decode over HTTP, tier on / off (SmolLM2-135M):", flush=True)
        result["decode"] = tier_decode(args.quick)
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    write_result(args.out, "kv_tier.json", result, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
