"""KV dtype accuracy against float32 KV, on the real default model in its deterministic mode
(the default), and the capacity of each dtype in a 4 GiB budget:

- one fixed text, teacher-forced (one prefill whose attention reads every key and value back
  from the cache, so each position sees the stored past): top-1 agreement and mean / max
  KL(fp32 || dtype) of the next-token distributions;
- ``--prompts`` chat prompts (questions drawn from fixed topic and question lists), each
  answered greedily for ``--answer`` tokens over a float32 cache; then every prompt + answer
  is teacher-forced over each dtype's cache, and at the answer's positions we count how often
  the dtype's top token is float32's (top-1 agreement) and how far the answer token's
  logprob moved (mean and 99th percentile of |logprob_fp32 - logprob_dtype|).

    python -m benchmarks.kv_accuracy [--tokens 512] [--prompts 200] [--answer 24]
                                     [--dtypes bfloat16,float16,int8,fp8]
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


TOPICS = ("photosynthesis", "the water cycle", "compound interest", "binary search",
          "the French revolution", "plate tectonics", "vaccines", "black holes", "inflation",
          "TCP handshakes", "the immune system", "volcanoes", "recursion", "supply and demand",
          "the Roman empire", "electric cars", "climate change", "DNA replication",
          "public key cryptography", "the stock market", "coral reefs", "jazz music",
          "the printing press", "machine learning", "earthquakes", "the moon landing",
          "sleep", "coffee", "bees", "rainbows", "glaciers", "the internet", "tea ceremonies",
          "chess openings", "marathon training", "bread baking", "solar panels", "tides",
          "the Renaissance", "password managers")
QUESTIONS = ("Explain {} to a ten-year-old.", "What are three surprising facts about {}?",
             "Write a short poem about {}.", "Why does {} matter today?",
             "Summarize the history of {} in two sentences.", "What is a common myth about {}?")


def chat_prompts(tokenizer, count: int) -> list[list[int]]:
    """``count`` chat-templated questions, the same ones on every run."""
    pairs = [(t, q) for q in QUESTIONS for t in TOPICS][:count]
    return [tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": q.format(t)}], add_generation_prompt=True))
        for t, q in pairs]


def logits_with(loaded, tokens: list[int], kv_dtype: str) -> torch.Tensor:
    """[len(tokens), V] float32 logits of one prefill over a KV cache in ``kv_dtype``."""
    cfg = loaded.config
    blocks = -(-len(tokens) // BLOCK)
    kv = KVCache(cfg.num_layers, blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim, kv_dtype)
    batch = build_forward_batch([tokens], [0], [list(range(blocks))], BLOCK,
                                logits_rows=[list(range(len(tokens)))], deterministic=True)
    return loaded.model.forward(batch, kv)


def greedy_answer(loaded, prompt: list[int], count: int) -> list[int]:
    """``count`` greedy tokens after ``prompt`` over a float32 cache (decode steps)."""
    cfg = loaded.config
    blocks = -(-(len(prompt) + count) // BLOCK)
    kv = KVCache(cfg.num_layers, blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim, "float32")
    table, tokens, new = [list(range(blocks))], list(prompt), list(prompt)
    for _ in range(count):
        batch = build_forward_batch([new], [len(tokens) - len(new)], table, BLOCK,
                                    deterministic=True)
        new = [int(loaded.model.forward(batch, kv)[-1].argmax())]
        tokens += new
    return tokens[len(prompt):]


def answer_drift(loaded, prompts: list[list[int]], answer: int, dtypes: list[str]) -> dict:
    """Per dtype, over every answer position of every prompt: top-1 agreement with float32
    KV and the drift of the answer token's logprob."""
    agree = {d: [] for d in dtypes}
    drift = {d: [] for d in dtypes}
    for prompt in prompts:
        tokens = prompt + greedy_answer(loaded, prompt, answer)
        rows = slice(len(prompt) - 1, len(tokens) - 1)        # predicting each answer token
        targets = torch.tensor(tokens[len(prompt):])
        ref = logits_with(loaded, tokens, "float32")[rows].log_softmax(-1)
        for name in dtypes:
            got = logits_with(loaded, tokens, name)[rows].log_softmax(-1)
            agree[name].append(got.argmax(-1) == ref.argmax(-1))
            drift[name].append((ref.gather(1, targets[:, None]) - got.gather(1, targets[:, None]))
                               .abs()[:, 0])
    out = {}
    for name in dtypes:
        a, d = torch.cat(agree[name]).float(), torch.cat(drift[name])
        out[name] = {"positions": int(a.numel()), "top1_agreement": round(float(a.mean()), 4),
                     "mean_logprob_drift": float(f"{float(d.mean()):.3g}"),
                     "p99_logprob_drift": float(f"{float(d.quantile(0.99)):.3g}")}
    return out


def compare(reference: torch.Tensor, other: torch.Tensor) -> dict:
    """Top-1 agreement and mean / max KL(reference || other) over positions."""
    log_p, log_q = reference.log_softmax(-1), other.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)                           # [T]
    return {"top1_agreement": round(float((reference.argmax(-1) == other.argmax(-1)).float().mean()), 4),
            "mean_kl": float(f"{float(kl.mean()):.3g}"), "max_kl": float(f"{float(kl.max()):.3g}")}


def run(num_tokens: int, dtypes: list[str], budget_gb: float = 4.0, prompts: int = 200,
        answer: int = 24) -> dict:
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
    if prompts:
        drift = answer_drift(loaded, chat_prompts(loaded.tokenizer, prompts), answer, dtypes)
        for name, entry in drift.items():
            out["dtypes"][name]["answers"] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--dtypes", default="bfloat16,float16,int8,fp8")
    parser.add_argument("--prompts", type=int, default=200, help="chat prompts (0: none)")
    parser.add_argument("--answer", type=int, default=24, help="greedy tokens a prompt")
    args = parser.parse_args(argv)
    print(json.dumps(run(args.tokens, args.dtypes.split(","), prompts=args.prompts,
                         answer=args.answer), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
