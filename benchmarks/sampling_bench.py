"""Per-step sampling cost at 16 streams: ``python -m benchmarks.sampling_bench`` (~1 min).

The logits are the default model's own (a decode step of 16 streams with 128 cached tokens
each); each stream carries a 256-token prompt and a growing output, so the penalties count
real histories incrementally. Configurations, interleaved round by round (median per step):

- ``old``: the per-row sampler this replaced (kept below: a per-row loop, ``.cpu()`` and
  ``.item()`` per sampled row) with temperature, top_k and top_p;
- ``off``: today's batched sampler, seeded temperature 1.0 and nothing else;
- ``same``: today's, with the old configuration's values (temperature, top_k, top_p);
- ``all``: every parameter on (temperature, top_k, top_p, min_p, seed, presence, frequency
  and repetition penalties, 8 logit_bias entries, min_tokens).

It also times the decode forward of those 16 streams and reports each sampler's share of
a step (forward + sampling) and ``all`` versus ``off`` over the whole step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from radixgate.runtime.engine.api import SamplingParams
from radixgate.runtime.model.batch import build_forward_batch
from radixgate.runtime.model.kv_cache import KVCache
from radixgate.runtime.model.loader import load_model
from radixgate.runtime.engine.sampling import TokenCounts, make_generator, sample_tokens

BLOCK = 16
STREAMS = 16
PROMPT_LEN = 256
CACHED = 128


# -- the per-row sampler before batched sampling (radixgate/runtime/engine/sampling.py at 6d49a3f), for comparison ----------

def old_sample_tokens(logits, params, generators):
    n = logits.shape[0]
    result = [0] * n
    for row in range(n):
        result[row] = _old_sample_row(logits[row], params[row], generators[row])
    return result


def _old_sample_row(row, params, generator):
    row = row.float().cpu()
    row = row.masked_fill(row.isnan(), float("-inf"))
    top = row.max()
    if not torch.isfinite(top):
        return int(row.argmax())
    masked = row == float("-inf")
    scaled = ((row - top) / params.temperature).masked_fill(masked, float("-inf"))
    if 0 < params.top_k < scaled.shape[0]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs[mass_before >= params.top_p] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=generator).item())


# -- the measurement -----------------------------------------------------------------------

CONFIGS = {
    "off": lambda i: SamplingParams(temperature=1.0, seed=i),
    "same": lambda i: SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=i),
    "all": lambda i: SamplingParams(
        temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, seed=i, presence_penalty=0.5,
        frequency_penalty=0.5, repetition_penalty=1.2, min_tokens=1000, max_tokens=2000,
        logit_bias=tuple((100 * i + j, 1.5) for j in range(8))),
}


class DecodeStep:
    """The default model's decode forward of STREAMS streams with CACHED tokens cached each
    (positions kept fixed: every round computes the same step)."""

    def __init__(self, loaded):
        self.model, cfg, self.device = loaded.model, loaded.config, loaded.device
        self.ids = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 40)
        per = -(-(CACHED + 1) // BLOCK)
        self.kv = KVCache(cfg.num_layers, per * STREAMS, BLOCK, cfg.num_kv_heads, cfg.head_dim,
                          loaded.dtype, loaded.device)
        self.tables = [list(range(i * per, (i + 1) * per)) for i in range(STREAMS)]
        prompts = [self.ids[i:i + CACHED] for i in range(STREAMS)]
        self.model.forward(build_forward_batch(prompts, [0] * STREAMS, self.tables, BLOCK,
                                               self.device), self.kv)

    def __call__(self) -> tuple[torch.Tensor, float]:
        batch = build_forward_batch([[self.ids[CACHED + i]] for i in range(STREAMS)],
                                    [CACHED] * STREAMS, self.tables, BLOCK, self.device)
        start = time.perf_counter()
        logits = self.model.forward(batch, self.kv)       # [STREAMS, V]
        _sync(logits)
        return logits, time.perf_counter() - start


def _sync(tensor: torch.Tensor) -> None:
    if tensor.is_cuda:
        torch.cuda.synchronize()


class Runner:
    """One configuration's per-stream state (generators, histories) across steps."""

    def __init__(self, name: str, vocab: int):
        self.name = name
        factory = CONFIGS.get(name, CONFIGS["same"])
        self.params = [factory(i) for i in range(STREAMS)]
        self.generators = [make_generator(p) for p in self.params]
        g = torch.Generator().manual_seed(0)
        self.histories = [TokenCounts(torch.randint(0, vocab, (PROMPT_LEN,), generator=g).tolist(),
                                      PROMPT_LEN) for _ in range(STREAMS)]

    def step(self, logits: torch.Tensor) -> float:
        start = time.perf_counter()
        if self.name == "old":
            tokens = old_sample_tokens(logits, self.params, self.generators)
        else:
            tokens = sample_tokens(logits, self.params, self.generators, self.histories, (0, 2))
        elapsed = time.perf_counter() - start
        for history, token in zip(self.histories, tokens):
            history.tokens.append(token)
        return elapsed


def run(rounds: int) -> dict:
    """Each round: one decode forward, then every sampler on its logits (plus noise, so
    the histories grow with varied tokens), so machine load hits all of them alike."""
    loaded = load_model()
    decode = DecodeStep(loaded)
    runners: list[Runner] = []
    times: dict[str, list[float]] = {"forward": []}
    for step in range(rounds + 3):
        logits, forward_s = decode()
        if not runners:
            runners = [Runner(name, logits.shape[1]) for name in ("old", "off", "same", "all")]
            times.update({r.name: [] for r in runners})
        noise = torch.randn(logits.shape, generator=torch.Generator().manual_seed(step))
        noisy = logits + 0.5 * noise.to(logits.device)
        elapsed = {r.name: r.step(noisy) for r in runners}
        if step >= 3:                                      # warm-up rounds not counted
            times["forward"].append(forward_s)
            for name, value in elapsed.items():
                times[name].append(value)
    ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
    forward_ms = ms.pop("forward")
    step_ms = {name: forward_ms + v for name, v in ms.items()}
    return {"device": str(logits.device), "vocab": logits.shape[1], "streams": STREAMS,
            "threads": torch.get_num_threads(), "rounds": rounds, "forward_ms": forward_ms,
            "sampling_ms": ms,
            "share_of_step": {name: ms[name] / step_ms[name] for name in ms},
            "all_vs_off_step": step_ms["all"] / step_ms["off"] - 1,
            "all_vs_off_sampling": ms["all"] / ms["off"],
            "same_vs_old_sampling": ms["same"] / ms["old"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.rounds)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['device']}, vocab {result['vocab']}, {STREAMS} streams, "
          f"{result['threads']} torch threads; decode forward {result['forward_ms']:.1f} ms "
          f"(medians of {result['rounds']} rounds)")
    print("| sampler | ms / step | share of step |\n|---|---|---|")
    for name, value in result["sampling_ms"].items():
        print(f"| {name} | {value:.2f} | {100 * result['share_of_step'][name]:.1f}% |")
    print(f"all vs off: step +{100 * result['all_vs_off_step']:.1f}%, sampling "
          f"{result['all_vs_off_sampling']:.2f}x; same values vs old sampler "
          f"{result['same_vs_old_sampling']:.2f}x")


if __name__ == "__main__":
    main()
