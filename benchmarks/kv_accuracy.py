"""KV dtype accuracy against float32 KV: top-1 agreement and mean KL(fp32 || dtype) of the
next-token distributions over a fixed text, teacher-forced (one prefill whose attention reads
every key and value back from the cache, so each position sees the stored past), on the real
default model; plus the capacity of each dtype in a 4 GiB budget.

    python -m benchmarks.kv_accuracy [--tokens 512] [--dtypes bfloat16,float16,int8,fp8]
"""
from __future__ import annotations

import argparse
import json

import torch

from radixgate.runtime.model.batch import build_forward_batch
from radixgate.runtime.model.kv_cache import KVCache
from radixgate.runtime.model.loader import load_model

BLOCK = 16
TEXT = ("The museum of natural history opens its new hall of minerals this spring. Visitors "
        "walk past a wall of quartz, a slab of banded iron from the oldest rocks on Earth and "
        "a meteorite that fell in a farmer's field a century ago. A guide explains how crystals "
        "grow from cooling magma and from water that seeps through cracks, why some stones "
        "glow under ultraviolet light, and how miners once followed veins of silver deep into "
        "the mountains. Children can hold a lump of pyrite, weigh it against real gold and "
        "learn why it fooled so many prospectors. ")


def logits_with(loaded, tokens: list[int], kv_dtype: str) -> torch.Tensor:
    """[len(tokens), V] float32 logits of one prefill over a KV cache in ``kv_dtype``."""
    cfg = loaded.config
    blocks = -(-len(tokens) // BLOCK)
    kv = KVCache(cfg.num_layers, blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim, kv_dtype)
    batch = build_forward_batch([tokens], [0], [list(range(blocks))], BLOCK,
                                logits_rows=[list(range(len(tokens)))])
    return loaded.model.forward(batch, kv)


def compare(reference: torch.Tensor, other: torch.Tensor) -> dict:
    """Top-1 agreement and mean / max KL(reference || other) over positions."""
    log_p, log_q = reference.log_softmax(-1), other.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)                           # [T]
    return {"top1_agreement": round(float((reference.argmax(-1) == other.argmax(-1)).float().mean()), 4),
            "mean_kl": float(f"{float(kl.mean()):.3g}"), "max_kl": float(f"{float(kl.max()):.3g}")}


def run(num_tokens: int, dtypes: list[str], budget_gb: float = 4.0) -> dict:
    loaded = load_model()
    tokens = (loaded.tokenizer.encode(TEXT * (1 + num_tokens // 80)))[:num_tokens]
    reference = logits_with(loaded, tokens, "float32")
    cfg = loaded.config
    out = {"model": loaded.name, "tokens": len(tokens), "weights_dtype": loaded.weights_dtype,
           "dtypes": {}}
    for name in ["float32", *dtypes]:
        blocks = KVCache.blocks_for_budget(int(budget_gb * 2**30), cfg.num_layers, cfg.num_kv_heads,
                                           cfg.head_dim, BLOCK, name)
        entry = {"bytes_per_token": KVCache(1, 1, 1, cfg.num_kv_heads, cfg.head_dim, name).bytes_per_token
                 * cfg.num_layers, f"blocks_in_{budget_gb:g}_gib": blocks, "tokens": blocks * BLOCK}
        if name != "float32":
            entry.update(compare(reference, logits_with(loaded, tokens, name)))
        out["dtypes"][name] = entry
    base = out["dtypes"]["float32"][f"blocks_in_{budget_gb:g}_gib"]
    for entry in out["dtypes"].values():
        entry["x_float32"] = round(entry[f"blocks_in_{budget_gb:g}_gib"] / base, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--dtypes", default="bfloat16,float16,int8,fp8")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.tokens, args.dtypes.split(",")), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
