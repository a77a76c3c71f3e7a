"""Runtime speed and memory side by side with llama.cpp's ``llama-server``, in one run:
``python -m benchmarks.peer_speed`` (10-12 min on 2 shared cores, most of it llama-server
prefilling its 8 arriving users slot by slot: on an Ice Lake host 16 users took it 235 s a
repetition and the run 22 min; ``--quick``: one repetition with shorter decodes, about 4 min).

Both servers get the same GGUF (the default SmolLM2-135M Q4_1), the same 2 threads and the
same KV capacity in tokens: llama-server ``-np 16 -cb -c C`` (its defaults otherwise: prompt
cache on, ``--cache-reuse 0``, ``--cache-ram 8192`` MiB, f16 KV; with ``-np 16`` it reports
``kv_unified = false``, so each slot holds C / 16 = 2,304 tokens),
radixgate ``serve`` with ``--no-deterministic`` and ``--kv-cache-gb`` sized to hold the same C
tokens, drafts off (``--spec none``: ``benchmarks.spec_bench`` measures them). A third server is radixgate as it starts by default, in its deterministic mode (a
row of its own, ``radixgate_deterministic``, and its cost as deterministic / no-deterministic;
``--no-deterministic`` skips it). Two repetitions, interleaved (llama-server, radixgate,
deterministic, then the reverse), each a
fresh server process measuring, over ``/v1/completions`` (greedy, ``ignore_eos``, fixed
``max_tokens``, the same token ids for both):

- start to healthy (``GET /health`` answers 200);
- single-stream decode tok/s (tokens after the first / time after the first);
- the same with another process spinning on one core (``busy_core``: the governor's case);
- 16 concurrent streams: all their tokens / wall time;
- cold prefill: time to first token of a fresh 2,048-token prompt;
- cached prefix: time to first token of that prompt + 16 new tokens;
- 8 users arriving together on a new 2,000-token system prompt: wall time until all end;
- RSS after one short request (light load) and peak RSS (``VmHWM``) of the server process.

The memory roofline: decode tok/s x weight bytes read per token / copy bandwidth, the last a
torch ``copy_`` of 256 MiB on the same threads, measured before and after the servers (the
higher is used). Weight bytes per token: radixgate's loaded matmul weights and norms
(``LlamaModel.weight_bytes``; one embedding row aside); llama.cpp's GGUF tensor bytes (the
tied Q8_0 embedding is its output matrix, so every tensor is read). Ratios are
radixgate / llama-server, one per repetition.

The peer: the binary named by ``RADIXGATE_LLAMA_SERVER`` or
``~/.cache/radixgate/llama.cpp/build/bin/llama-server`` (``benchmarks.peers``); without it the
peer is skipped with a note. Writes ``peer_speed[_quick].json`` into ``--out``. ``--long``:
the long-context rows instead (2k, 4k and 8k tokens of context, ``benchmarks.peer_long``).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from benchmarks.launch import (ADMIN_KEY, ServerProcess, bench_spec, free_port, tenant_key,
                               wait_healthy)
from benchmarks.peers import LLAMA_SERVER_BUILD_NOTE, peer_binary
from benchmarks.report import machine_info, save_report
from benchmarks.text import TextGen
from benchmarks.traces import default_gguf_path, load_tokenizer

OUT_DIR = Path(__file__).parent / "out"
THREADS = 2
PARALLEL = 16
RADIXGATE, LLAMA = "radixgate", "llama_server"
RADIXGATE_DET = "radixgate_deterministic"     # the default server: deterministic
# drafts off: greedy ``ignore_eos`` text loops, so drafts would make these figures (and the
# roofline) about the text, not the step; benchmarks.spec_bench measures drafts
SERVER_FLAGS = {RADIXGATE: ("--no-deterministic", "--spec", "none"), RADIXGATE_DET: ("--spec", "none")}


@dataclass(frozen=True, slots=True)
class Sizes:
    decode_tokens: int = 128       # the single stream's answer
    short_prompt: int = 24         # prompt of the single stream and of each concurrent one
    streams: int = 16
    stream_tokens: int = 64
    prefill_tokens: int = 2048     # the cold prompt
    suffix_tokens: int = 16        # new tokens after the cached prefix
    system_tokens: int = 2000      # the shared system prompt of the arriving users
    users: int = 8                 # 16 until 2026-12-03 (the run then took 22 min on Ice Lake)
    user_tokens: int = 24
    user_answer_tokens: int = 16
    context_tokens: int = 36864    # llama-server -c (2,304 a slot) = radixgate's KV capacity
    repetitions: int = 2
    copy_mib: int = 256


SIZES = {
    "default": Sizes(),
    "quick": Sizes(decode_tokens=64, stream_tokens=32, repetitions=1),
    "tiny": Sizes(decode_tokens=8, short_prompt=8, streams=4, stream_tokens=8,
                  prefill_tokens=96, suffix_tokens=8, system_tokens=80, users=4, user_tokens=8,
                  user_answer_tokens=4, context_tokens=2048, repetitions=1, copy_mib=32),
}


# -- prompts ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Prompts:
    """Token ids, the same for both servers within a repetition; every long prompt starts
    with its own nonce, so nothing is cached across kinds or repetitions."""
    warmup: list[int]
    single: list[int]
    shorts: list[list[int]]        # one per concurrent stream
    document: list[int]            # the cold prompt
    suffix: list[int]              # after the document: the cached-prefix request
    system: list[int]              # the arriving users' shared prefix
    questions: list[list[int]]     # one per user


def make_prompts(tokenizer, sizes: Sizes, seed: int) -> Prompts:
    rng = random.Random(seed)
    gen = TextGen(rng)

    def take(text: str, n: int) -> list[int]:
        ids = tokenizer.encode(text)
        assert len(ids) >= n, f"text gave {len(ids)} tokens, {n} wanted"
        return ids[:n]

    def fresh(kind: str, n: int) -> list[int]:
        nonce = f"[{kind} {seed} {rng.getrandbits(48):012x}] "
        return take(nonce + gen.document(kind.title(), n + 100), n)

    def short(n: int) -> list[int]:
        return take(f"{rng.getrandbits(32):08x} {gen.question()} {gen.paragraph(n + 20)}", n)

    return Prompts(
        warmup=short(sizes.short_prompt), single=short(sizes.short_prompt),
        shorts=[short(sizes.short_prompt) for _ in range(sizes.streams)],
        document=fresh("handbook", sizes.prefill_tokens),
        suffix=take(" " + gen.paragraph(sizes.suffix_tokens + 10), sizes.suffix_tokens),
        system=fresh("system", sizes.system_tokens),
        questions=[short(sizes.user_tokens) for _ in range(sizes.users)])


# -- one streamed completion --------------------------------------------------------------

@dataclass(slots=True)
class Reply:
    sent: float
    first: float               # first chunk with a choice: the first token
    done: float
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int

    @property
    def ttft_s(self) -> float:
        return self.first - self.sent

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first over the time after the first."""
        return (self.completion_tokens - 1) / (self.done - self.first)


async def complete(session: aiohttp.ClientSession, base_url: str, prompt: list[int],
                   max_tokens: int, extra: dict | None = None) -> Reply:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            **(extra or {})}
    sent, first, usage = time.perf_counter(), None, {}
    async with session.post(base_url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{base_url}: HTTP {resp.status}: {await resp.text()}")
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and first is None:
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    done = time.perf_counter()
    return Reply(sent, first if first is not None else done, done,
                 usage.get("completion_tokens", 0), usage.get("prompt_tokens", 0),
                 (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


async def together(session, base_url: str, prompts: list[list[int]], max_tokens: int,
                    extra: dict | None = None):
    """All requests at once: (replies, wall seconds from the first send to the last end)."""
    started = time.perf_counter()
    replies = await asyncio.gather(*(complete(session, base_url, p, max_tokens, extra)
                                     for p in prompts))
    return replies, time.perf_counter() - started


# -- the measurements of one server -------------------------------------------------------

def memory_mb(pid: int) -> dict:
    """VmRSS and VmHWM (peak resident set) of ``pid``, MB (10^6 bytes)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = round(int(value.split()[0]) * 1024 / 1e6, 1)
    return fields


@contextlib.contextmanager
def busy_core():
    """Another process spinning on one core for the ``with`` block (the case a shared host
    or a noisy neighbour gives: the server's 2 threads then share 2 cores with a third)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        yield
    finally:
        spinner.kill()
        spinner.wait(timeout=10)


async def measure_server(base_url: str, pid: int, prompts: Prompts, sizes: Sizes,
                         headers: dict | None = None) -> dict:
    """Every figure of one running server (see the module docstring), in order: warm-up,
    single stream, concurrent streams, cold prefill, cached prefix, arriving users."""
    timeout = aiohttp.ClientTimeout(total=1800)
    connector = aiohttp.TCPConnector(force_close=True)   # llama-server drops idle keep-alives
    async with aiohttp.ClientSession(timeout=timeout, headers=headers or {},
                                     connector=connector) as session:
        await complete(session, base_url, prompts.warmup, 4)
        light = memory_mb(pid)
        single = await complete(session, base_url, prompts.single, sizes.decode_tokens)
        with busy_core():
            busy = await complete(session, base_url, prompts.single, sizes.decode_tokens)
        streams, streams_wall = await together(session, base_url, prompts.shorts,
                                                sizes.stream_tokens)
        cold = await complete(session, base_url, prompts.document, 1)
        cached = await complete(session, base_url, prompts.document + prompts.suffix, 1)
        users, users_wall = await together(session, base_url,
                                            [prompts.system + q for q in prompts.questions],
                                            sizes.user_answer_tokens)
    streams_tokens = sum(r.completion_tokens for r in streams)
    return {
        "single_stream_tok_s": round(single.decode_tok_s, 2),
        "single_stream_tokens": single.completion_tokens,
        "single_stream_busy_core_tok_s": round(busy.decode_tok_s, 2),
        "streams": len(streams), "streams_tokens": streams_tokens,
        "streams_wall_s": round(streams_wall, 4),
        "streams_tok_s": round(streams_tokens / streams_wall, 2),
        "cold_prefill_tokens": cold.prompt_tokens,
        "cold_prefill_ttft_s": round(cold.ttft_s, 4),
        "cached_prefix_prompt_tokens": cached.prompt_tokens,
        "cached_prefix_cached_tokens": cached.cached_tokens,
        "cached_prefix_ttft_s": round(cached.ttft_s, 4),
        "users": len(users), "users_tokens": sum(r.completion_tokens for r in users),
        "users_cached_tokens": sum(r.cached_tokens for r in users),
        "users_ttft_p50_s": round(statistics.median(r.ttft_s for r in users), 4),
        "users_wall_s": round(users_wall, 4),
        "rss_light_mb": light["VmRSS"], "peak_rss_mb": memory_mb(pid)["VmHWM"],
    }


# -- the two servers ----------------------------------------------------------------------

@dataclass
class LlamaServer:
    """``llama-server -m GGUF -t 2 -tb 2 -np 16 -cb -c C`` on a free loopback port."""
    binary: Path
    model: Path
    context_tokens: int
    threads: int = THREADS
    parallel: int = PARALLEL
    port: int = 0
    proc: subprocess.Popen | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="llama-server-")))
    extra_args: tuple[str, ...] = ()       # e.g. ("--spec-type", "ngram-simple")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [str(self.binary), "-m", str(self.model), "-t", str(self.threads),
                "-tb", str(self.threads), "-np", str(self.parallel), "-cb",
                "-c", str(self.context_tokens), "--host", "127.0.0.1", "--port", str(self.port),
                "--no-webui", *self.extra_args]

    def start(self, timeout_s: float = 120.0) -> "LlamaServer":
        self.port = free_port()
        with open(self.workdir / "server.log", "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(self.proc, self.base_url, timeout_s, self.log_tail)
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def log_tail(self, n_chars: int = 3000) -> str:
        return (self.workdir / "server.log").read_text(errors="replace")[-n_chars:]


@dataclass(frozen=True, slots=True)
class RadixgateModelFacts:
    """What the benchmark process learns by loading the model once itself."""
    weight_bytes: int          # read per decoded token
    kv_bytes_per_token: int    # of the KV dtype the server will pick by default
    kv_dtype: str
    weights_dtype: str


def radixgate_model_facts(tiny: bool, deterministic: bool = False) -> RadixgateModelFacts:
    """The facts of the server as ``deterministic`` or not (the default KV dtype follows the
    mode: ``resolve_kv_dtype``)."""
    from radixgate.kv import CacheConfig
    from radixgate.kv.dtypes import kv_bytes_per_token
    from radixgate.runtime.model.kv_cache import resolve_kv_dtype
    from radixgate.runtime.model.loader import load_model
    loaded = load_model(tiny=tiny)
    model, config = loaded.model, loaded.config
    norms = model.norm.nbytes + sum(layer.attn_norm.nbytes + layer.mlp_norm.nbytes
                                    for layer in model.layers)
    kv_dtype = resolve_kv_dtype(CacheConfig().kv_dtype, loaded.dtype, loaded.device,
                                deterministic and _deterministic_holds(model))
    return RadixgateModelFacts(
        model.weight_bytes() + norms,
        kv_bytes_per_token(config.num_layers, config.num_kv_heads, config.head_dim, kv_dtype),
        kv_dtype, loaded.weights_dtype)


def _deterministic_holds(model) -> bool:
    try:
        model.check_deterministic()
    except ValueError:
        return False
    return True


def gguf_bytes_per_token(path: str) -> int:
    """Tensor bytes llama.cpp reads per decoded token: all of them, except that with a
    separate ``output.weight`` only one row of ``token_embd`` is read (counted as none)."""
    import gguf
    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(path).tensors}
    total = sum(tensors.values())
    return total - tensors.get("token_embd.weight", 0) if "output.weight" in tensors else total


def kv_cache_gb_for(tokens: int, bytes_per_token: int, block_size: int = 16) -> float:
    """A budget that ``blocks_for_budget`` floors to exactly ``tokens / block_size`` blocks."""
    return (tokens * bytes_per_token + bytes_per_token * block_size // 2) / (1 << 30)


async def radixgate_capacity_tokens(base_url: str) -> int | None:
    """The KV capacity the server reports (``/v1/cache/stats``: blocks x block size)."""
    async with aiohttp.ClientSession(headers={"x-api-key": ADMIN_KEY}) as session:
        async with session.get(base_url + "/v1/cache/stats") as resp:
            stats = await resp.json()
    blocks = stats.get("blocks") or {}
    total = blocks.get("total") if isinstance(blocks, dict) else None
    return total * stats["block_size"] if total and "block_size" in stats else None


def run_radixgate(prompts: Prompts, sizes: Sizes, kv_cache_gb: float, tiny: bool,
                  flags: tuple[str, ...] = ()) -> dict:
    started = time.perf_counter()
    server = ServerProcess(bench_spec(("--threads", str(THREADS), *flags), tiny=tiny,
                                      kv_cache_gb=kv_cache_gb)).start()
    try:
        healthy = time.perf_counter() - started
        headers = {"x-api-key": tenant_key("default")}
        figures = asyncio.run(measure_server(server.base_url, server.proc.pid, prompts, sizes,
                                             headers))
        capacity = asyncio.run(radixgate_capacity_tokens(server.base_url))
    finally:
        server.stop()
    return {"start_to_healthy_s": round(healthy, 2), "capacity_tokens": capacity,
            "kv_cache_gb": round(kv_cache_gb, 4), **figures}


def run_llama(binary: Path, prompts: Prompts, sizes: Sizes) -> dict:
    server = LlamaServer(binary, Path(default_gguf_path()), sizes.context_tokens)
    started = time.perf_counter()
    server.start()
    try:
        healthy = time.perf_counter() - started
        figures = asyncio.run(measure_server(server.base_url, server.proc.pid, prompts, sizes))
    finally:
        server.stop()
    return {"start_to_healthy_s": round(healthy, 2), "capacity_tokens": sizes.context_tokens,
            **figures}


def radixgate_default_budget(prompts: Prompts, tiny: bool) -> dict:
    """radixgate at its default KV budget under light load (one short request)."""
    from radixgate.kv import CacheConfig
    budget = CacheConfig().kv_cache_gb
    started = time.perf_counter()
    server = ServerProcess(bench_spec(("--threads", str(THREADS)), tiny=tiny,
                                      kv_cache_gb=budget)).start()
    try:
        healthy = time.perf_counter() - started

        async def one() -> None:
            headers = {"x-api-key": tenant_key("default")}
            async with aiohttp.ClientSession(headers=headers) as session:
                await complete(session, server.base_url, prompts.single, 16)
        asyncio.run(one())
        memory = memory_mb(server.proc.pid)
    finally:
        server.stop()
    return {"kv_cache_gb": budget, "start_to_healthy_s": round(healthy, 2),
            "rss_light_mb": memory["VmRSS"], "peak_rss_mb": memory["VmHWM"]}


# -- bandwidth, summary, report -----------------------------------------------------------

def copy_bandwidth_gbs(mib: int = 256, repeats: int = 5, threads: int = THREADS) -> float:
    """Bytes copied per second (10^9) by ``dst.copy_(src)`` of ``mib`` MiB, best of ``repeats``."""
    import torch
    torch.set_num_threads(threads)
    src = torch.ones(mib << 18)                       # float32: mib MiB
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - started)
    return round(src.nbytes / best / 1e9, 2)


METRICS = ("start_to_healthy_s", "single_stream_tok_s", "single_stream_busy_core_tok_s",
           "streams_tok_s", "cold_prefill_ttft_s",
           "cached_prefix_ttft_s", "users_wall_s", "rss_light_mb", "peak_rss_mb",
           "single_stream_roofline")


def add_roofline(run: dict, bytes_per_token: int, bandwidth_gbs: float) -> None:
    """Share of the copy bandwidth the single stream's weight reads use."""
    run["single_stream_roofline"] = round(
        run["single_stream_tok_s"] * bytes_per_token / (bandwidth_gbs * 1e9), 4)


def _ratios(top: list, bottom: list) -> list:
    return [round(a / b, 3) if b else None for a, b in zip(top, bottom)]


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Per metric: each server's values by repetition and ratios, one per repetition, side by
    side: ``ratio`` radixgate / llama-server, ``ratio_deterministic`` the deterministic mode's
    / llama-server, ``deterministic_cost`` the deterministic mode's / the default mode's."""
    summary = {}
    for metric in METRICS:
        entry = {name: [run[metric] for run in server_runs] for name, server_runs in runs.items()}
        if LLAMA in runs:
            entry["ratio"] = _ratios(entry[RADIXGATE], entry[LLAMA])
            if RADIXGATE_DET in runs:
                entry["ratio_deterministic"] = _ratios(entry[RADIXGATE_DET], entry[LLAMA])
        if RADIXGATE_DET in runs:
            entry["deterministic_cost"] = _ratios(entry[RADIXGATE_DET], entry[RADIXGATE])
        summary[metric] = entry
    return summary


def interleaved(rep: int, names: list[str]) -> list[str]:
    """Interleaved: A B, then B A, ..."""
    return names if rep % 2 == 0 else names[::-1]


def run_benchmark(mode: str = "default", llama_binary: Path | None = None,
                  default_budget: bool = True, log=print, deterministic_row: bool = True) -> dict:
    sizes, tiny = SIZES[mode], mode == "tiny"
    bandwidth = [copy_bandwidth_gbs(sizes.copy_mib)]
    facts = radixgate_model_facts(tiny)
    modes = {RADIXGATE: facts, RADIXGATE_DET: radixgate_model_facts(tiny, True)}
    kv_bytes = {name: f.kv_bytes_per_token for name, f in modes.items()}
    tokenizer = load_tokenizer()
    names = ([LLAMA] if llama_binary else []) + [RADIXGATE] + \
        ([RADIXGATE_DET] if deterministic_row else [])
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for rep in range(sizes.repetitions):
        prompts = make_prompts(tokenizer, sizes, seed=rep)
        for name in interleaved(rep, names):
            log(f"repetition {rep + 1}/{sizes.repetitions}: {name}")
            run = (run_llama(llama_binary, prompts, sizes) if name == LLAMA
                   else run_radixgate(prompts, sizes,
                                      kv_cache_gb_for(sizes.context_tokens, kv_bytes[name]),
                                      tiny, SERVER_FLAGS[name]))
            runs[name].append({"repetition": rep + 1, **run})
    extra = radixgate_default_budget(make_prompts(tokenizer, sizes, 99), tiny) \
        if default_budget else None
    bandwidth.append(copy_bandwidth_gbs(sizes.copy_mib))
    bytes_per_token = {RADIXGATE: facts.weight_bytes, RADIXGATE_DET: facts.weight_bytes}
    if llama_binary:
        bytes_per_token[LLAMA] = gguf_bytes_per_token(default_gguf_path())
    for name, server_runs in runs.items():
        for run in server_runs:
            add_roofline(run, bytes_per_token[name], max(bandwidth))
    bytes_per_token = {name: bytes_per_token[name] for name in names}
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "mode": mode,
        "machine": machine_info(),
        "sizes": asdict(sizes), "threads": THREADS,
        "peer": ({"binary": str(llama_binary), "args": f"-np {PARALLEL} -cb -c "
                  f"{sizes.context_tokens} -t {THREADS} -tb {THREADS}"} if llama_binary
                 else {"skipped": LLAMA_SERVER_BUILD_NOTE}),
        "radixgate": {"weights_dtype": facts.weights_dtype,
                      "kv_dtype": {name: f.kv_dtype for name, f in modes.items()},
                      "kv_bytes_per_token": kv_bytes},
        "copy_bandwidth_gbs": bandwidth, "bytes_per_token": bytes_per_token,
        "runs": runs, "summary": summarize(runs), "radixgate_default_budget": extra,
    }


def _cell(values: list) -> str:
    return " / ".join("-" if v is None else f"{v:g}" for v in values)


def markdown(report: dict) -> str:
    names = list(report["runs"])
    ratio_names = [key for key in ("ratio", "ratio_deterministic", "deterministic_cost")
                   if key in next(iter(report["summary"].values()), {})]
    titles = {"ratio": "no-deterministic / llama-server",
              "ratio_deterministic": "default (deterministic) / llama-server",
              "deterministic_cost": "deterministic / no-deterministic"}
    head = "| metric | " + " | ".join(names + [titles[k] for k in ratio_names]) + " |"
    lines = [head, "|---" * (len(head.split("|")) - 2) + "|"]
    for metric, entry in report["summary"].items():
        cells = [_cell(entry[name]) for name in names]
        cells += [_cell(entry[key]) + "x" for key in ratio_names]
        lines.append(f"| {metric} | " + " | ".join(cells) + " |")
    lines.append(f"\nmachine: {report['machine']}")
    lines.append(f"copy bandwidth {_cell(report['copy_bandwidth_gbs'])} GB/s; weight bytes "
                 f"per token {report['bytes_per_token']}; peer: {report['peer']}")
    if report["radixgate_default_budget"]:
        lines.append(f"radixgate at the default budget: {report['radixgate_default_budget']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="one repetition, shorter decodes")
    size.add_argument("--tiny", action="store_true", help="random tiny model, tiny prompts (tests)")
    parser.add_argument("--llama-server", type=Path, help="the llama-server binary")
    parser.add_argument("--no-peer", action="store_true", help="radixgate only")
    parser.add_argument("--no-default-budget", action="store_true",
                        help="skip the run at radixgate's default KV budget")
    parser.add_argument("--no-deterministic", action="store_true",
                        help="skip the default (deterministic) server's row")
    parser.add_argument("--long", action="store_true",
                        help="the long-context rows instead (benchmarks/peer_long.py)")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    mode = "tiny" if args.tiny else "quick" if args.quick else "default"
    skip_peer = args.no_peer or mode == "tiny"     # tiny: a random model, nothing to compare
    binary = peer_binary(args.llama_server, skip_peer)
    if args.long:
        from benchmarks.peer_long import long_markdown, run_long_benchmark
        report = run_long_benchmark(mode, binary, not args.no_deterministic,
                                    log=lambda m: print(m, file=sys.stderr, flush=True))
        save_report(report, args.out, "peer_long", mode, argv or sys.argv[1:])
        print(long_markdown(report))
        return
    report = run_benchmark(mode, binary, not args.no_default_budget,
                           log=lambda m: print(m, file=sys.stderr, flush=True),
                           deterministic_row=not args.no_deterministic)
    save_report(report, args.out, "peer_speed", mode, argv or sys.argv[1:])
    print(markdown(report))


if __name__ == "__main__":
    main()
