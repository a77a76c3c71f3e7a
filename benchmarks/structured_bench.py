"""Constrained versus free decoding on the default model: ``python -m benchmarks.structured_bench``.

For 1 and 16 concurrent streams (each its own prompt, greedy), interleaved round by round
(``--rounds``, the median round of each reported):

- ``free``: unconstrained, ``ignore_eos``, ``--tokens`` output tokens each;
- ``json``: a JSON schema (an array of 8 small objects: longer than ``--tokens``, so every
  stream decodes as many tokens as a free one) with jump-forward off: the cost of masks;
- ``json+jf``: the same with jump-forward on (forced tokens computed in one step);
- ``json+batched``: ``json`` with the k constrained rows' masks filled by llguidance's
  batched fill (its thread pool) instead of one after another (the A/B of
  ``grammar_masks.MaskFill``; ``--kinds json json+batched`` runs just that pair).

Reported per configuration: output tokens per second over the wall time, forward steps
per output token, and the ratio to ``free`` (goal >= 0.9 without jump-forward). Also the
mask time per constrained token (on the worker thread, overlapped with the forward) and
the time the sampler still waited for masks after the forward, compile times of a few
schemas on this vocabulary (each a fresh one: no cache), and ``fill_us``: the fill of k
masks alone (no engine), one after another against batched, interleaved position by
position along a valid instance (median microseconds).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from radixgate.runtime.engine import grammar_masks
from radixgate.runtime.engine.api import Request, SamplingParams
from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.engine.engine_config import EngineConfig
from radixgate.runtime.engine.grammar import GrammarCompiler, json_grammar
from radixgate.runtime.model.loader import load_model
from radixgate.kv import CacheConfig

ROWS = {"type": "object", "additionalProperties": False, "required": ["rows"],
        "properties": {"rows": {"type": "array", "minItems": 8, "maxItems": 8, "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "score"],
            "properties": {"name": {"type": "string", "maxLength": 12},
                           "score": {"type": "integer", "minimum": 0, "maximum": 100}}}}}}
COMPILE_SCHEMAS = {
    "tool (3 props)": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"}}},
    "rows (nested array)": ROWS,
    "order (anyOf, pattern, $defs)": {
        "$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string",
                                                                    "pattern": "^[A-Z]-[0-9]+$"},
                                                            "qty": {"type": "integer"}}}},
        "type": "object", "properties": {
            "items": {"type": "array", "items": {"$ref": "#/$defs/item"}},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "email": {"type": "string", "format": "email"}}},
}


class MaskTimer:
    """Wraps the worker's mask computation and the sampler's wait to time them."""

    def __init__(self):
        self.compute_s: list[float] = []
        self.rows = 0
        self.wait_s: list[float] = []
        self._compute, self._result = grammar_masks.compute_masks, grammar_masks.PendingMasks.result

    def install(self) -> None:
        timer = self

        def compute(grammars, vocab_size, fill=None):
            started = time.perf_counter()
            out = timer._compute(grammars, vocab_size, fill)
            timer.compute_s.append(time.perf_counter() - started)
            timer.rows += len(grammars)
            return out

        def result(pending):
            started = time.perf_counter()
            out = timer._result(pending)
            timer.wait_s.append(time.perf_counter() - started)
            return out

        grammar_masks.compute_masks, grammar_masks.PendingMasks.result = compute, result


def run(engine: Engine, requests: list[Request]) -> dict:
    before = engine.request_snapshot().result(timeout=60).steps
    started = time.perf_counter()
    futures = [engine.submit_future(r) for r in requests]
    done = [f.result(timeout=900) for f in futures]
    wall = time.perf_counter() - started
    steps = engine.request_snapshot().result(timeout=60).steps - before
    tokens = sum(len(d.output_token_ids) for d in done)
    return {"tok_s": round(tokens / wall, 1), "steps_per_token": round(steps / tokens * len(requests), 3),
            "tokens": tokens}


def requests_for(loaded, compiled, streams: int, tokens: int, kind: str) -> list[Request]:
    out = []
    for i in range(streams):
        messages = [{"role": "user", "content": f"List 8 players of team {i} with scores as JSON."}]
        prompt = loaded.tokenizer.encode(loaded.tokenizer.apply_chat_template(messages))
        free = kind == "free"
        out.append(Request(prompt, SamplingParams(max_tokens=tokens, temperature=0.0,
                                                  ignore_eos=free),
                           namespace=f"bench-{kind}-{i}",
                           grammar=None if free else compiled.matcher()))
    return out


def fill_times(loaded, compiled, ks: list[int]) -> dict:
    """Filling k masks alone, one after another vs batched (separate matchers fed the same
    tokens), at each of the first 64 positions of a valid instance; medians in us."""
    instance = json.dumps({"rows": [{"name": f"player {i}", "score": 7 * i} for i in range(8)]},
                          separators=(", ", ": "))
    tokens = loaded.tokenizer.encode(instance)[:64]
    words = (loaded.config.vocab_size + 31) // 32
    out = {}
    for k in ks:
        fills = {"loop": grammar_masks.MaskFill(None), "batched": grammar_masks.MaskFill(1)}
        grammars = {name: [compiled.matcher() for _ in range(k)] for name in fills}
        times: dict[str, list[float]] = {name: [] for name in fills}
        for token in tokens:
            for name, fill in fills.items():
                bits = torch.empty((k, words), dtype=torch.int32)
                started = time.perf_counter()
                fill(grammars[name], bits)
                times[name].append(time.perf_counter() - started)
                for grammar in grammars[name]:
                    grammar.consume(token)
        out[f"k={k}"] = {name: round(1e6 * statistics.median(t), 1) for name, t in times.items()}
    return out


def compile_times(compiler: GrammarCompiler, rounds: int) -> dict:
    out = {}
    for name, schema in COMPILE_SCHEMAS.items():
        times = []
        for n in range(rounds):
            fresh = {**schema, "title": f"fresh-{n}"}
            started = time.perf_counter()
            compiler.compile(json_grammar(fresh))
            times.append(time.perf_counter() - started)
        out[name] = round(1e3 * statistics.median(times), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per stream")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS),
                        help="configurations to compare (ratios are to free when it runs)")
    args = parser.parse_args()
    loaded = load_model("default")
    compiler = GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size)
    compiled = compiler.compile(json_grammar(ROWS))
    report: dict = {"compile_ms": compile_times(compiler, 5),
                    "fill_us": fill_times(loaded, compiled, sorted(set(args.streams)))}
    timer = MaskTimer()
    timer.install()
    engines = {}
    for kind in args.kinds:
        jump, batched = KINDS[kind]
        engines[kind] = Engine(loaded, EngineConfig(
            cache=CacheConfig(kv_cache_gb=0.25, enable_prefix_cache=False), jump_forward=jump,
            max_num_seqs=64)).start()
        engines[kind].core.grammar_masks.fill = grammar_masks.MaskFill(1 if batched else None)
    try:
        for engine in engines.values():
            engine.generate(requests_for(loaded, compiled, 1, 8, "free")[0])   # warm up
        for streams in args.streams:
            report.update(compare(engines, loaded, compiled, streams, args))
    finally:
        for engine in engines.values():
            engine.shutdown(grace_s=0)
    report["mask_us_per_row"] = round(1e6 * sum(timer.compute_s) / max(timer.rows, 1), 1)
    report["mask_wait_us_per_step_p50"] = round(1e6 * statistics.median(timer.wait_s), 1)
    print(json.dumps(report, indent=1))


KINDS = {"free": (False, False), "json": (False, False), "json+jf": (True, False),
         "json+batched": (False, True)}     # kind: (jump-forward, batched mask fill)


def compare(engines, loaded, compiled, streams: int, args) -> dict:
    """The configurations interleaved round by round (each on its own engine); the median
    round of each, with its ratio to ``free`` and ``json+batched``'s to ``json``."""
    runs: dict[str, list[dict]] = {kind: [] for kind in engines}
    for _ in range(args.rounds):
        for kind, engine in engines.items():
            runs[kind].append(run(engine, requests_for(loaded, compiled, streams, args.tokens,
                                                       kind)))
    out = {}
    for kind, results in runs.items():
        results.sort(key=lambda r: r["tok_s"])
        out[f"{streams} streams {kind}"] = results[len(results) // 2]
    for kind, base in (("json", "free"), ("json+jf", "free"), ("json+batched", "free"),
                       ("json+batched", "json")):
        if kind in engines and base in engines:
            entry = out[f"{streams} streams {kind}"]
            entry[f"vs_{base}"] = round(entry["tok_s"] / out[f"{streams} streams {base}"]["tok_s"], 3)
    return out


if __name__ == "__main__":
    main()
