"""Long context side by side with llama-server: ``python -m benchmarks.peer_speed --long``
(about 6 min on 2 cores; ``--quick --long``: one repetition, 2k and 4k only).

One request at a time, as a user with a long document: a cold prompt of about 2k, 4k and 8k
tokens (each with its own nonce: nothing cached), then ``decode_tokens`` streamed after it
(greedy, ``ignore_eos``). Per context: time to first token and decode tok/s (tokens after the
first over the time after the first). Both servers hold one sequence of ``slot_tokens``:
llama-server ``-np 1 -c 8192`` (f16 KV, its default), radixgate a KV budget of the same
tokens in its own KV dtype; the same three servers as ``peer_speed`` (llama-server, radixgate
``--no-deterministic``, radixgate as it starts by default), drafts off, interleaved over the
repetitions.

The bandwidth limit of a decoded token at context n is (weight bytes + n x KV bytes per
token) / the copy bandwidth: ``decode_roofline`` is the decode rate times those bytes over
the bandwidth (1.0 would read every weight and every cached key and value once per token at
the copy speed), with n the mean context of the decode.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from benchmarks.launch import ServerProcess, bench_spec, tenant_key
from benchmarks.text import TextGen

LLAMA_KV_BYTES = 2          # llama-server's default f16 cache


@dataclass(frozen=True, slots=True)
class LongSizes:
    contexts: tuple[int, ...] = (2048, 4096, 8000)
    decode_tokens: int = 64
    slot_tokens: int = 8192          # one sequence: llama-server -np 1 -c 8192
    repetitions: int = 2


LONG_SIZES = {"default": LongSizes(), "quick": LongSizes(contexts=(2048, 4096), repetitions=1),
              "tiny": LongSizes(contexts=(64, 128), decode_tokens=4, slot_tokens=512,
                                repetitions=1)}


def long_prompts(tokenizer, sizes: LongSizes, seed: int) -> list[list[int]]:
    """One fresh document a context length, its own nonce first."""
    rng = random.Random(1000 + seed)
    gen = TextGen(rng)
    prompts = []
    for n in sizes.contexts:
        text = f"{rng.getrandbits(48):012x} (long {seed}) " + gen.document("Manual", n + 200)
        ids = tokenizer.encode(text)
        if len(ids) < n:
            raise ValueError(f"the document gave {len(ids)} tokens, {n} wanted")
        prompts.append(ids[:n])
    return prompts


async def measure_long(base_url: str, prompts: list[list[int]], decode_tokens: int,
                       headers: dict | None = None) -> list[dict]:
    """Each prompt cold, one after the other: its TTFT and decode rate."""
    from benchmarks.peer_speed import complete
    timeout = aiohttp.ClientTimeout(total=1800)
    connector = aiohttp.TCPConnector(force_close=True)
    rows = []
    async with aiohttp.ClientSession(timeout=timeout, headers=headers or {},
                                     connector=connector) as session:
        await complete(session, base_url, prompts[-1][:-33:-1], 4)    # warm-up: no shared prefix
        for prompt in prompts:
            reply = await complete(session, base_url, prompt, decode_tokens)
            rows.append({"context": len(prompt), "ttft_s": round(reply.ttft_s, 4),
                         "decode_tok_s": round(reply.decode_tok_s, 2),
                         "completion_tokens": reply.completion_tokens,
                         "cached_tokens": reply.cached_tokens})
    return rows


def run_long_radixgate(prompts, sizes: LongSizes, kv_cache_gb: float, tiny: bool,
                       flags: tuple[str, ...]) -> list[dict]:
    from benchmarks.peer_speed import THREADS
    server = ServerProcess(bench_spec(("--threads", str(THREADS), *flags), tiny=tiny,
                                      kv_cache_gb=kv_cache_gb,
                                      max_model_len=sizes.slot_tokens)).start()
    try:
        return asyncio.run(measure_long(server.base_url, prompts, sizes.decode_tokens,
                                        {"x-api-key": tenant_key("default")}))
    finally:
        server.stop()


def run_long_llama(binary: Path, prompts, sizes: LongSizes) -> list[dict]:
    from benchmarks.peer_speed import LlamaServer
    from benchmarks.traces import default_gguf_path
    server = LlamaServer(binary, Path(default_gguf_path()), sizes.slot_tokens, parallel=1)
    server.start()
    try:
        return asyncio.run(measure_long(server.base_url, prompts, sizes.decode_tokens))
    finally:
        server.stop()


def add_long_roofline(rows: list[dict], weight_bytes: int, kv_bytes_per_token: int,
                      bandwidth_gbs: float, decode_tokens: int) -> None:
    """``decode_roofline`` of each row (module docstring)."""
    for row in rows:
        context = row["context"] + decode_tokens / 2
        per_token = weight_bytes + context * kv_bytes_per_token
        row["decode_roofline"] = round(row["decode_tok_s"] * per_token / (bandwidth_gbs * 1e9), 4)


def run_long_benchmark(mode: str, llama_binary: Path | None, deterministic_row: bool,
                       log=print) -> dict:
    """Every server's rows by repetition, and the ratios per context (see ``long_summary``)."""
    from benchmarks import peer_speed as ps
    from benchmarks.report import machine_info
    from benchmarks.traces import load_tokenizer
    sizes, tiny = LONG_SIZES[mode], mode == "tiny"
    bandwidth = [ps.copy_bandwidth_gbs()]
    facts = {ps.RADIXGATE: ps.radixgate_model_facts(tiny),
             ps.RADIXGATE_DET: ps.radixgate_model_facts(tiny, True)}
    tokenizer = load_tokenizer()
    names = ([ps.LLAMA] if llama_binary else []) + [ps.RADIXGATE] + \
        ([ps.RADIXGATE_DET] if deterministic_row else [])
    runs: dict[str, list[list[dict]]] = {name: [] for name in names}
    for rep in range(sizes.repetitions):
        prompts = long_prompts(tokenizer, sizes, rep)
        for name in ps.interleaved(rep, names):
            log(f"long context, repetition {rep + 1}/{sizes.repetitions}: {name}")
            runs[name].append(run_long_llama(llama_binary, prompts, sizes) if name == ps.LLAMA
                              else run_long_radixgate(
                                  prompts, sizes, ps.kv_cache_gb_for(
                                      sizes.slot_tokens, facts[name].kv_bytes_per_token),
                                  tiny, ps.SERVER_FLAGS[name]))
    bandwidth.append(ps.copy_bandwidth_gbs())
    kv_bytes = {name: f.kv_bytes_per_token for name, f in facts.items()}
    kv_dtypes = {name: f.kv_dtype for name, f in facts.items()}
    weights = {name: f.weight_bytes for name, f in facts.items()}
    if llama_binary:
        weights[ps.LLAMA] = ps.gguf_bytes_per_token(ps.default_gguf_path())
        kv_bytes[ps.LLAMA] = _llama_kv_bytes_per_token(tiny)
    for name, reps in runs.items():
        for rows in reps:
            add_long_roofline(rows, weights[name], kv_bytes[name], max(bandwidth),
                              sizes.decode_tokens)
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "mode": mode,
            "machine": machine_info(), "sizes": asdict(sizes), "copy_bandwidth_gbs": bandwidth,
            "kv_bytes_per_token": kv_bytes, "weight_bytes": weights,
            "kv_dtype": kv_dtypes,
            "runs": runs, "summary": long_summary(runs)}


def _llama_kv_bytes_per_token(tiny: bool) -> int:
    from radixgate.runtime.model.loader import load_model
    config = load_model(tiny=tiny).config
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * LLAMA_KV_BYTES


METRICS = ("ttft_s", "decode_tok_s", "decode_roofline")


def long_summary(runs: dict[str, list[list[dict]]]) -> list[dict]:
    """One entry per context: each server's values by repetition, and each radixgate row's
    ratio to llama-server's (one per repetition)."""
    from benchmarks.peer_speed import LLAMA
    names = list(runs)
    first = runs[names[0]][0]
    summary = []
    for index, row in enumerate(first):
        entry = {"context": row["context"]}
        for metric in METRICS:
            values = {name: [reps[index][metric] for reps in runs[name]] for name in names}
            entry[metric] = values
            if LLAMA in values:
                entry[metric + "_ratio"] = {
                    name: [round(a / b, 3) if b else None for a, b in zip(v, values[LLAMA])]
                    for name, v in values.items() if name != LLAMA}
        summary.append(entry)
    return summary


def long_markdown(report: dict) -> str:
    def cell(values):
        return " / ".join("-" if v is None else f"{v:g}" for v in values)
    names = list(report["runs"])
    head = "| context | metric | " + " | ".join(names) + " | ratios to llama-server |"
    lines = [head, "|---" * (len(names) + 3) + "|"]
    for entry in report["summary"]:
        for metric in METRICS:
            ratios = entry.get(metric + "_ratio", {})
            ratio_text = "; ".join(f"{name} {cell(v)}x" for name, v in ratios.items())
            lines.append(f"| {entry['context']} | {metric} | "
                         + " | ".join(cell(entry[metric][n]) for n in names)
                         + f" | {ratio_text or '-'} |")
    lines.append(f"\nmachine: {report['machine']}")
    lines.append(f"copy bandwidth {cell(report['copy_bandwidth_gbs'])} GB/s; KV bytes per "
                 f"token {report['kv_bytes_per_token']}; weight bytes {report['weight_bytes']}")
    return "\n".join(lines)
