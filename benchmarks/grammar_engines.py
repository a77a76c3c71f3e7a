"""Grammar engines side by side on this model's vocabulary: ``python -m benchmarks.grammar_engines``.

Measures, for ``llguidance`` and ``xgrammar`` (each only when importable; radixgate depends
on llguidance alone, so install xgrammar by hand to compare, e.g. ``pip install --target
DIR xgrammar apache-tvm-ffi`` and ``PYTHONPATH=DIR``):

- tokenizer setup: building the engine's tokenizer object from our GGUF tokenizer (49,152
  tokens; no hub download);
- compile: a fresh JSON schema (a typical tool's ``parameters``, and a larger nested one)
  to a ready matcher, plus its first mask (llguidance builds lexer states lazily, so the
  first mask is part of its compile cost);
- mask: per-token time to compute the next-token bitmask while the tokens of a valid
  instance are fed in (median and 90th percentile over every position);
- footprint: installed size of the package and of the dependencies it adds beyond
  radixgate's own runtime dependencies.
"""
from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import re
import statistics
import time
from pathlib import Path

import torch

from radixgate.runtime.model.loader import gguf_tokenizer

TOOL_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOL_INSTANCE = {"city": "Paris", "unit": "celsius", "days": 3}

NESTED_SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {"type": "object", "properties": {
            "name": {"type": "string"}, "email": {"type": "string", "pattern": "^[^@]+@[^@]+$"},
            "vip": {"type": "boolean"}}, "required": ["name", "email"]},
        "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
            "sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1},
            "price": {"type": "number"}}, "required": ["sku", "quantity"]}},
        "notes": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["customer", "items"],
}
NESTED_INSTANCE = {"customer": {"name": "Ada Lovelace", "email": "ada@example.org", "vip": True},
                   "items": [{"sku": "A-100", "quantity": 2, "price": 9.5},
                             {"sku": "B-7", "quantity": 1, "price": 120.0}],
                   "notes": None}

RADIXGATE_RUNTIME = ("torch", "triton", "aiohttp", "xxhash", "pydantic", "gguf",
                     "tokenizers", "jinja2", "numpy", "safetensors", "prometheus-client")


class LLGuidanceEngine:
    name = "llguidance"

    def __init__(self, tokenizer):
        import llguidance
        self.ll = llguidance
        self.tokenizer = llguidance.LLTokenizer(tokenizer.backend.to_str(),
                                                eos_token=sorted(tokenizer.eos_token_ids))
        self.vocab = self.tokenizer.vocab_size

    def matcher(self, schema: dict):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False})
        matcher = self.ll.LLMatcher(self.tokenizer, grammar)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def fill(self, matcher, mask: torch.Tensor) -> None:
        matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)


class XGrammarEngine:
    name = "xgrammar"

    def __init__(self, tokenizer):
        import xgrammar
        self.xg = xgrammar
        vocab = [tokenizer.token_to_bytes(i) for i in range(tokenizer.vocab_size)]
        info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW,
                                      stop_token_ids=sorted(tokenizer.eos_token_ids))
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.vocab = tokenizer.vocab_size

    def matcher(self, schema: dict):
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                     separators=(",", ":"))
        return self.xg.GrammarMatcher(compiled)

    def fill(self, matcher, mask: torch.Tensor) -> None:
        matcher.fill_next_token_bitmask(mask[None, :])

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)


def fresh(schema: dict, n: int) -> dict:
    """A schema no cache has seen: one more optional property with a new name."""
    copy = json.loads(json.dumps(schema))
    copy["properties"][f"extra_{n}"] = {"type": "string"}
    return copy


def time_compile(engine, schema: dict, rounds: int) -> dict:
    compile_s, first_mask_s = [], []
    mask = torch.zeros((engine.vocab + 31) // 32, dtype=torch.int32)
    for n in range(rounds):
        started = time.perf_counter()
        matcher = engine.matcher(fresh(schema, n))
        compiled = time.perf_counter()
        engine.fill(matcher, mask)
        compile_s.append(compiled - started)
        first_mask_s.append(time.perf_counter() - compiled)
    return {"compile_ms": 1e3 * statistics.median(compile_s),
            "first_mask_ms": 1e3 * statistics.median(first_mask_s)}


def time_masks(engine, schema: dict, instance_ids: list[int], rounds: int) -> dict:
    mask = torch.zeros((engine.vocab + 31) // 32, dtype=torch.int32)
    per_token: list[float] = []
    for _ in range(rounds):
        matcher = engine.matcher(schema)
        for token in instance_ids:
            started = time.perf_counter()
            engine.fill(matcher, mask)
            per_token.append(time.perf_counter() - started)
            allowed = bool((int(mask[token // 32]) >> (token % 32)) & 1)
            assert allowed and engine.accept(matcher, token), f"{engine.name} refused {token}"
    per_token.sort()
    return {"mask_p50_us": 1e6 * per_token[len(per_token) // 2],
            "mask_p90_us": 1e6 * per_token[int(len(per_token) * 0.9)],
            "tokens": len(instance_ids)}


def footprint_mb(distribution: str) -> dict:
    """Installed size of ``distribution`` and of the dependencies it needs (recursively)
    that radixgate's own runtime dependencies do not already bring."""
    present = _closure(RADIXGATE_RUNTIME)
    extra = sorted(_closure([distribution]) - present - {distribution})
    return {"package_mb": round(_size_mb(distribution), 1),
            "added_deps_mb": {name: round(_size_mb(name), 1) for name in extra}}


def _closure(names) -> set[str]:
    """The installed distributions ``names`` require, themselves included (extras left out)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        key = todo.pop().lower().replace("_", "-")
        if key in seen:
            continue
        try:
            requires = metadata.distribution(key).requires or ()
        except metadata.PackageNotFoundError:
            continue
        seen.add(key)
        todo += [re.split(r"[ ;<>=!\[~(]", r, maxsplit=1)[0] for r in requires if "extra ==" not in r]
    return seen


def _size_mb(name: str) -> float:
    dist = metadata.distribution(name)
    total = sum(Path(dist.locate_file(f)).stat().st_size for f in dist.files or ()
                if Path(dist.locate_file(f)).is_file())
    return total / 2**20


def run_engine(cls, tokenizer, rounds: int) -> dict:
    started = time.perf_counter()
    engine = cls(tokenizer)
    result = {"tokenizer_setup_ms": 1e3 * (time.perf_counter() - started)}
    for label, schema, instance in (("tool", TOOL_SCHEMA, TOOL_INSTANCE),
                                    ("nested", NESTED_SCHEMA, NESTED_INSTANCE)):
        ids = tokenizer.encode(json.dumps(instance, separators=(",", ":")))
        result[label] = {**time_compile(engine, schema, rounds),
                         **time_masks(engine, schema, ids, rounds)}
    result["footprint"] = footprint_mb(cls.name)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = gguf_tokenizer("default")
    report = {"vocab": tokenizer.vocab_size}
    for cls in (LLGuidanceEngine, XGrammarEngine):
        try:
            report[cls.name] = run_engine(cls, tokenizer, args.rounds)
        except ImportError as exc:
            report[cls.name] = f"not installed ({exc})"
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
