"""The Llama relatives side by side, in one run (docs/ARCHITECTURE.md section 9): random models
of one size built with transformers' own classes (SmolLM2-135M's width, 8 layers, SmolLM2's
tokenizer), each served by the engine on a shared-system-prompt workload.

Per model: KV bytes per token (every layer), the hit rate of the workload (cached / prompt
tokens), and prefill and decode speed as ratios to the Llama model (window and soft-capped
layers attend through the torch path, kernels.window_attention). The window models run twice
in one KV budget: with their window layers counted in full (``window_ratio`` 1) and in a pool
of their own (``window_ratio`` 0.5, docs/ARCHITECTURE.md section 9b): tokens that fit (the
budget's bytes per token), hit rate and decode speed, pool against one pool (the JSON also
has the bytes held per cached token at the end: the tree keeps window data while room lasts,
so without pressure it is the one pool's).

    python -m benchmarks.arch_bench [--quick] [--out benchmarks/out]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.report import machine_info, save_report

SIZE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=8,
            num_attention_heads=9, num_key_value_heads=3, head_dim=64,
            max_position_embeddings=4096)
WINDOW = 512
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "mistral-window": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {
        "sliding_window": WINDOW, "query_pre_attn_scalar": 64}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
        "sliding_window": WINDOW, "query_pre_attn_scalar": 64,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
}


def build(folder: Path, name: str) -> Path:
    """A random model of ``SIZE`` with SmolLM2's tokenizer, saved as an HF folder."""
    import transformers
    from radixgate.runtime.model.loader import gguf_tokenizer
    config_cls, model_cls, extra = MODELS[name]
    config = getattr(transformers, config_cls)(**SIZE, **extra, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    getattr(transformers, model_cls)(config).save_pretrained(folder)
    gguf_tokenizer("default").backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>",
         "eos_token": "<|im_end|>"}))
    return folder


def workload(system_tokens: int, users: int, turns: int) -> list[list[int]]:
    """Prompts: one shared system prompt, then each user's own growing conversation."""
    system = [(13 * i) % 40000 + 300 for i in range(system_tokens)]
    return [system + [(2000 + 97 * user + i) % 49000 for i in range(24 * (turn + 1))]
            for turn in range(turns) for user in range(users)]


BUDGET_GB = 0.375                # 2,048 blocks of every layer (fp32)
POOL_RATIO = 0.5


def measure(folder: Path, prompts: list[list[int]], decode_tokens: int,
            window_ratio: float = 1.0) -> dict:
    from radixgate.kv import CacheConfig
    from radixgate.runtime.engine.api import Request, SamplingParams
    from radixgate.runtime.engine.engine import Engine
    from radixgate.runtime.engine.engine_config import EngineConfig
    from radixgate.runtime.model.loader import load_model
    model = load_model(str(folder), device="cpu", weights_dtype="float32", max_model_len=4096)
    cache = CacheConfig(kv_cache_gb=BUDGET_GB, kv_dtype="float32", window_ratio=window_ratio)
    engine = Engine(model, EngineConfig(cache=cache, max_model_len=4096)).start()
    try:
        read = total = 0
        for prompt in prompts:
            done = engine.generate(Request(prompt, SamplingParams(max_tokens=1, temperature=0.0)))
            read, total = read + done.usage.cache_read_tokens, total + len(prompt)
        held = held_bytes_per_token(engine)
        cold = [t + 1 for t in prompts[-1]]          # nothing cached: a whole prefill
        started = time.perf_counter()
        engine.generate(Request(cold, SamplingParams(max_tokens=1, temperature=0.0)))
        prefill_s = time.perf_counter() - started
        started = time.perf_counter()
        engine.generate(Request(prompts[0], SamplingParams(max_tokens=decode_tokens,
                                                           temperature=0.0, ignore_eos=True)))
        decode_s = time.perf_counter() - started
        tokens_fit = engine.core.kv.num_tokens
    finally:
        engine.shutdown(grace_s=0)
    return {"kv_bytes_per_token": model.config.kv_bytes_per_token(4),
            "window_layers": sum(1 for w in model.config.layer_windows if w),
            "tokens_fit": tokens_fit, "held_bytes_per_cached_token": held,
            "hit_rate": read / total, "prefill_tok_s": len(cold) / prefill_s,
            "decode_tok_s": decode_tokens / decode_s}


def held_bytes_per_token(engine) -> float:
    """KV bytes the cache holds now (main blocks and window blocks in use) per cached token."""
    snap = engine.request_snapshot().result(timeout=60)
    kv, B = engine.core.kv, snap.block_size
    per_layer_block = kv.bytes_per_token // kv.num_layers * B
    main_layers = kv.num_layers - len(kv.window_layers)
    held = (snap.blocks.total - snap.blocks.free) * per_layer_block * main_layers
    pool = snap.window_pool
    if pool is not None:
        held += (pool["blocks"] - pool["free"]) * per_layer_block * len(kv.window_layers)
    return held / max(snap.tree.cached_tokens, 1)


def run(quick: bool) -> dict:
    prompts = workload(2 * WINDOW + 100, 4 if quick else 8, 2)
    decode = 16 if quick else 48
    results, pools = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            folder = build(Path(tmp) / name, name)
            results[name] = measure(folder, prompts, decode)
            print(name, json.dumps(results[name]), flush=True)
            if "sliding_window" in MODELS[name][2]:
                pools[name] = measure(folder, prompts, decode, POOL_RATIO)
                print(name, "window pool", json.dumps(pools[name]), flush=True)
    base = results["llama"]
    for row in list(results.values()) + list(pools.values()):
        row["prefill_vs_llama"] = row["prefill_tok_s"] / base["prefill_tok_s"]
        row["decode_vs_llama"] = row["decode_tok_s"] / base["decode_tok_s"]
    for name, row in pools.items():
        row["tokens_fit_vs_one_pool"] = row["tokens_fit"] / results[name]["tokens_fit"]
        row["held_vs_one_pool"] = (row["held_bytes_per_cached_token"]
                                   / results[name]["held_bytes_per_cached_token"])
        row["decode_vs_one_pool"] = row["decode_tok_s"] / results[name]["decode_tok_s"]
    return {"machine": machine_info(), "threads": torch.get_num_threads(), "window": WINDOW,
            "system_prompt_tokens": len(prompts[0]) - 24, "requests": len(prompts),
            "budget_gb": BUDGET_GB, "pool_ratio": POOL_RATIO, "models": results,
            "window_pools": pools}


def markdown(report: dict) -> str:
    lines = ["| model | window layers | KV bytes/token (fp32) | hit rate | prefill vs llama | "
             "decode vs llama |", "|---|---|---|---|---|---|"]
    for name, r in report["models"].items():
        lines.append(f"| {name} | {r['window_layers']} of {SIZE['num_hidden_layers']} | "
                     f"{r['kv_bytes_per_token']:,} | {r['hit_rate']:.3f} | "
                     f"{r['prefill_vs_llama']:.2f}x | {r['decode_vs_llama']:.2f}x |")
    lines += ["", f"Window pool (ratio {report['pool_ratio']}) against one pool, same "
              f"{report['budget_gb']} GiB budget:", "",
              "| model | tokens fit (vs one pool) | budget bytes per token | hit rate (one pool) "
              "| decode vs one pool |", "|---|---|---|---|---|"]
    budget = report["budget_gb"] * 2**30
    for name, r in report["window_pools"].items():
        one = report["models"][name]
        lines.append(f"| {name} | {r['tokens_fit']:,} ({r['tokens_fit_vs_one_pool']:.2f}x) | "
                     f"{budget / r['tokens_fit']:,.0f} ({budget / one['tokens_fit']:,.0f}) | "
                     f"{r['hit_rate']:.3f} ({one['hit_rate']:.3f}) | "
                     f"{r['decode_vs_one_pool']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 users, 16 decode tokens")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    args = parser.parse_args(argv)
    report = run(args.quick)
    path = save_report(report, args.out, "arch_bench", "quick" if args.quick else "default",
                       sys.argv[1:] if argv is None else argv)
    print(markdown(report))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
