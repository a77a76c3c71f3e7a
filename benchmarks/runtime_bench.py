"""Engine figures on the default model, CPU: ``python -m benchmarks.runtime_bench``.

1. TTFT of a shared prefix (2,048 tokens) + 32-token suffix: cold, then cached (another
   suffix after the same prefix), in one run. Goal: cached / cold <= 0.05.
2. Decode throughput: 16 concurrent streams vs 1 (aggregate output tokens / wall time,
   32 new tokens each). Goal: >= 4x.
3. transformers ``generate`` on the same GGUF and the same token ids: TTFT of the
   shared-prefix prompt and aggregate decode throughput (1 and 16 sequences, batched with
   left padding), as ratios.
4. Engine overhead at 16 streams: share of step time spent outside the model forward
   (goal < 5%), and the same share of the whole wall time.

Prints a markdown table and writes ``runtime.json`` into ``--out`` (default
``benchmarks/out``). ``--quick`` halves the prefix and the streams' lengths.
"""
from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.cli import size_parser, write_result
from benchmarks.text import TextGen
from radixgate.runtime.engine.api import Request, SamplingParams
from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.engine.engine_config import EngineConfig
from radixgate.runtime.model.loader import load_model

OUT_DIR = Path(__file__).parent / "out"


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def make_prompts(tokenizer, prefix_len: int, suffix_len: int, seed: int = 0):
    """(prefix tokens, list of 4 suffixes, 16 short distinct prompts)."""
    gen = TextGen(random.Random(seed))
    prefix = tokenizer.encode(gen.document("Operations handbook", prefix_len + 200))[:prefix_len]
    suffixes = [tokenizer.encode(" " + gen.paragraph(suffix_len + 10))[:suffix_len] for _ in range(4)]
    shorts = [tokenizer.encode(gen.question() + " " + gen.sentence())[:24] for _ in range(16)]
    return prefix, suffixes, shorts


def engine_ttft(engine: Engine, prefix, suffixes) -> dict:
    cold = engine.generate(Request(prefix + suffixes[0], _params(1)))
    cached = [engine.generate(Request(prefix + s, _params(1))) for s in suffixes[1:]]
    assert all(c.usage.cache_read_tokens >= len(prefix) for c in cached), "prefix was not reused"
    cached_ttft = statistics.median(c.usage.ttft_s for c in cached)
    return {"cold_s": cold.usage.ttft_s, "cached_s": cached_ttft,
            "cached_over_cold": cached_ttft / cold.usage.ttft_s,
            "prompt_tokens": len(prefix) + len(suffixes[0]),
            "cache_read_tokens": cached[0].usage.cache_read_tokens}


def engine_decode(engine: Engine, prompts, new_tokens: int) -> dict:
    """Aggregate output tokens / wall seconds for len(prompts) concurrent streams."""
    before = engine.request_snapshot().result()
    started = time.perf_counter()
    futures = [engine.submit_future(Request(p, _params(new_tokens))) for p in prompts]
    results = [f.result() for f in futures]
    wall = time.perf_counter() - started
    after = engine.request_snapshot().result()
    tokens = sum(r.usage.output_tokens for r in results)
    step_s = after.step_time_s - before.step_time_s
    forward_s = after.forward_time_s - before.forward_time_s
    return {"streams": len(prompts), "output_tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "step_s": step_s, "forward_s": forward_s,
            "overhead_share_of_steps": (step_s - forward_s) / step_s,
            "overhead_share_of_wall": (wall - forward_s) / wall}


def transformers_figures(prefix, suffixes, shorts, new_tokens: int) -> dict:
    from benchmarks.peers import load_transformers_model
    model = load_transformers_model()
    eos = model.generation_config.eos_token_id
    pad = eos if isinstance(eos, int) else eos[0]
    ids = torch.tensor([prefix + suffixes[0]])
    with torch.inference_mode():
        model.generate(torch.tensor([shorts[0]]), max_new_tokens=2, do_sample=False,
                       pad_token_id=pad)                               # warm-up
        started = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1,
                       do_sample=False, pad_token_id=pad)
        ttft = time.perf_counter() - started
        decode = {n: _hf_decode(model, shorts[:n], new_tokens, pad) for n in (1, 16)}
    return {"ttft_s": ttft, "decode_tokens_per_s": decode}


def _hf_decode(model, prompts, new_tokens: int, pad: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    started = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
    wall = time.perf_counter() - started
    return (out.shape[1] - width) * len(prompts) / wall


def run(quick: bool) -> dict:
    prefix_len, new_tokens = (1024, 16) if quick else (2048, 32)
    loaded = load_model("default", max_model_len=4096)
    config = EngineConfig(num_blocks=1024, max_model_len=4096, max_step_tokens=512,
                          max_num_seqs=32)
    prefix, suffixes, shorts = make_prompts(loaded.tokenizer, prefix_len, 32)
    engine = Engine(loaded, config).start()
    try:
        engine.generate(Request(shorts[0], _params(4)))                  # warm-up
        ttft = engine_ttft(engine, prefix, suffixes)
        _progress("engine TTFT", ttft)
        one = engine_decode(engine, shorts[:1], new_tokens)
        many = engine_decode(engine, shorts, new_tokens)
        _progress("engine decode", {"1": one["tokens_per_s"], "16": many["tokens_per_s"],
                                    "overhead": many["overhead_share_of_steps"]})
    finally:
        engine.shutdown(grace_s=0)
    del engine
    hf = transformers_figures(prefix, suffixes, shorts, new_tokens)
    _progress("transformers", hf)
    return {
        "model": loaded.name, "prefix_tokens": prefix_len, "suffix_tokens": 32,
        "new_tokens": new_tokens, "threads": torch.get_num_threads(),
        "ttft": ttft, "decode_1": one, "decode_16": many, "transformers": hf,
        "ratios": {
            "ttft_cached_over_cold": ttft["cached_over_cold"],
            "decode_16_over_1": many["tokens_per_s"] / one["tokens_per_s"],
            "ttft_cold_over_transformers": ttft["cold_s"] / hf["ttft_s"],
            "ttft_cached_over_transformers": ttft["cached_s"] / hf["ttft_s"],
            "decode_1_over_transformers_1": one["tokens_per_s"] / hf["decode_tokens_per_s"][1],
            "decode_16_over_transformers_16": many["tokens_per_s"] / hf["decode_tokens_per_s"][16],
            "engine_overhead_share_16": many["overhead_share_of_steps"],
        },
    }


def _progress(label: str, values: dict) -> None:
    print(f"[runtime_bench] {label}: {json.dumps(values, default=str)}", file=sys.stderr, flush=True)


def table(result: dict) -> str:
    r, t, hf = result["ratios"], result["ttft"], result["transformers"]
    rows = [
        ("TTFT cold (s)", f"{t['cold_s']:.3f}", ""),
        ("TTFT cached (s)", f"{t['cached_s']:.3f}", ""),
        ("TTFT cached / cold", f"{r['ttft_cached_over_cold']:.3f}", "<= 0.05"),
        ("decode tok/s, 1 stream", f"{result['decode_1']['tokens_per_s']:.1f}", ""),
        ("decode tok/s, 16 streams", f"{result['decode_16']['tokens_per_s']:.1f}", ""),
        ("decode 16 / 1", f"{r['decode_16_over_1']:.2f}x", ">= 4x"),
        ("transformers TTFT (s)", f"{hf['ttft_s']:.3f}", ""),
        ("TTFT cold / transformers", f"{r['ttft_cold_over_transformers']:.3f}", ""),
        ("TTFT cached / transformers", f"{r['ttft_cached_over_transformers']:.3f}", ""),
        ("decode 1 / transformers 1", f"{r['decode_1_over_transformers_1']:.2f}x", ""),
        ("decode 16 / transformers batch 16", f"{r['decode_16_over_transformers_16']:.2f}x", ""),
        ("engine overhead at 16 streams (of step time)", f"{100 * r['engine_overhead_share_16']:.1f}%", "< 5%"),
        ("outside forward at 16 streams (of wall time)",
         f"{100 * result['decode_16']['overhead_share_of_wall']:.1f}%", ""),
    ]
    head = (f"Runtime bench: {result['model']}, prefix {result['prefix_tokens']} + suffix "
            f"{result['suffix_tokens']} tokens, {result['new_tokens']} new tokens per stream, "
            f"{result['threads']} threads\n\n| figure | value | goal |\n|---|---|---|\n")
    return head + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)


def main(argv: list[str] | None = None) -> int:
    args = size_parser(__doc__, quick="1,024-token prefix, 16 new tokens",
                       full="2,048-token prefix, 32 new tokens", out=OUT_DIR).parse_args(argv)
    result = run(quick=args.quick)
    write_result(args.out, "runtime.json", result)
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
