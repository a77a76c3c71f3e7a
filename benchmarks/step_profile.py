"""Where a step's milliseconds go: ``python -m benchmarks.step_profile``.

One loaded model (the default GGUF unless ``--weights-dtype`` says otherwise), four steps
per mode: a cold prefill of ``--prefill`` tokens, one stream decoding at ``--context``
positions, the same stream checking 4 drafts (5 rows: a speculative verify step), and 16
streams decoding at 128. Each part of the forward pass is timed by a
wrapper around the call that does it (the calls are synchronous CPU work): the int4
matmuls, the other matmuls, the head, attention, the small native ops (rope and K/V store,
residual + norm, silu), and the rest (Python and small torch ops) as the step's wall time
minus those. Modes interleave for ``--rounds`` rounds; medians in ms. ``--modes`` takes
``default``, ``deterministic``, and either with ``-torchpack`` (a second copy of the model
whose int4 layers keep torch's pack: torch's op, native_int4.c in the deterministic mode and
native_int4_amx.c in the default one, as before native_int4_fixed.c) or ``-op`` (torch's
pack, its op and dequantized GEMM only).
"""
from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager

import torch

from radixgate.kernels import native
from radixgate.runtime.model import linear, model as model_module
from radixgate.runtime.model.batch import build_forward_batch
from radixgate.runtime.model.kv_cache import KVCache
from radixgate.runtime.model.loader import load_model

BLOCK = 16
PARTS = ("int4 matmuls", "other matmuls", "head", "attention", "small native ops")


class Clock:
    """Seconds spent per part, for calls wrapped by ``timed`` (the outermost only)."""

    def __init__(self):
        self.spent = dict.fromkeys(PARTS, 0.0)
        self.depth = 0

    def timed(self, part: str, fn):
        def wrapper(*args, **kwargs):
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[part] += time.perf_counter() - start
                self.depth -= 1
        return wrapper


@contextmanager
def wrapped(clock: Clock, head_type: type):
    """Every timed callable replaced by its timed wrapper, put back afterwards."""
    targets = [(linear.Int4Linear, "native", "int4 matmuls"),
               (linear.Int8Linear, "native", "other matmuls"),
               (linear.DenseLinear, "native", "other matmuls"),
               (head_type, "native", "head"), (head_type, "__call__", "head"),
               (model_module, "paged_attention", "attention"),
               (model_module, "window_attention", "attention"),
               (native, "rope_store", "small native ops"),
               (native, "add_rms_norm", "small native ops"),
               (native, "silu_mul", "small native ops")]
    kept = []
    for owner, name, part in targets:
        if owner is head_type and head_type in (linear.DenseLinear, linear.Int8Linear):
            continue                       # a plain head: counted with the matmuls
        if name in vars(owner) or hasattr(owner, name):
            kept.append((owner, name, getattr(owner, name)))
            setattr(owner, name, clock.timed(part, getattr(owner, name)))
    try:
        yield
    finally:
        for owner, name, original in reversed(kept):
            setattr(owner, name, original)


def _set_kernels(model, mode: str) -> None:
    """torch's pack: its own kernels on or off as ``mode`` asks (``-op``: torch's op only)."""
    ours = not mode.endswith("-op")
    for layer in model.layers:
        for part in vars(layer).values():
            if isinstance(part, linear.Int4Linear) and part.fixed is None:
                tiled = part.shape[0] % 64 == 0
                part.native_op = ours and tiled and native.int4_mm_matches_torch()
                part.amx = ours and tiled and native.has_amx_int4()


def load_torch_pack(weights_dtype: str):
    """The model again with its int4 layers in torch's pack (the fixed layout refused)."""
    fixed = native.has_int4_fixed
    native.has_int4_fixed = lambda: False
    try:
        return load_model(weights_dtype=weights_dtype)
    finally:
        native.has_int4_fixed = fixed


def steps(loaded, prefill: int, context: int, deterministic: bool, kv_dtype: str = "float32"):
    """(name, ForwardBatch factory, KVCache) for the three steps of one mode."""
    cfg = loaded.config
    ids = (loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog. ") * 800)
    longest = max(prefill, context + 5)
    blocks = -(-longest // BLOCK)
    kv = KVCache(cfg.num_layers, blocks + 16 * 10, BLOCK, cfg.num_kv_heads, cfg.head_dim,
                 kv_dtype)
    table = list(range(blocks))
    tables16 = [list(range(blocks + i * 10, blocks + i * 10 + 10)) for i in range(16)]
    loaded.model.forward(build_forward_batch([ids[:context]], [0], [table], BLOCK,
                                             deterministic=deterministic), kv)
    loaded.model.forward(build_forward_batch([ids[:128]] * 16, [0] * 16, tables16, BLOCK,
                                             deterministic=deterministic), kv)
    return [
        ("prefill", lambda: build_forward_batch([ids[:prefill]], [0], [table], BLOCK,
                                                deterministic=deterministic)),
        ("decode 1", lambda: build_forward_batch([[ids[context]]], [context], [table], BLOCK,
                                                 deterministic=deterministic)),
        ("verify 5", lambda: build_forward_batch([ids[context:context + 5]], [context], [table],
                                                 BLOCK, deterministic=deterministic)),
        ("decode 16", lambda: build_forward_batch([[ids[128]]] * 16, [128] * 16, tables16,
                                                  BLOCK, deterministic=deterministic)),
    ], kv


def profile_mode(loaded, mode: str, args) -> dict[str, dict[str, float]]:
    deterministic = mode.startswith("deterministic")
    _set_kernels(loaded.model, mode)
    found, kv = steps(loaded, args.prefill, args.context, deterministic, args.kv_dtype)
    head_type = type(loaded.model.logits_proj)
    out = {}
    for name, make in found:
        repeat = 1 if name == "prefill" else args.decode_repeat
        batch = make()
        loaded.model.forward(batch, kv)                                   # warm
        clock = Clock()
        with wrapped(clock, head_type):
            start = time.perf_counter()
            for _ in range(repeat):
                loaded.model.forward(batch, kv)
            wall = (time.perf_counter() - start) / repeat
        parts = {part: spent / repeat * 1e3 for part, spent in clock.spent.items()}
        parts["rest"] = wall * 1e3 - sum(parts.values())
        parts["wall"] = wall * 1e3
        out[name] = parts
    _set_kernels(loaded.model, "")
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--context", type=int, default=512,
                        help="positions before the one-stream decode step")
    parser.add_argument("--decode-repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="default,deterministic")
    parser.add_argument("--weights-dtype", default="auto")
    parser.add_argument("--kv-dtype", default="float32", help="the KV cache's element type")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(weights_dtype=args.weights_dtype)
    modes = args.modes.split(",")
    packed = load_torch_pack(args.weights_dtype) if any(
        m.endswith(("-torchpack", "-op")) for m in modes) else None
    runs: dict[str, list] = {m: [] for m in modes}
    for round_ in range(args.rounds):
        for mode in (modes if round_ % 2 == 0 else modes[::-1]):
            model = loaded if mode in ("default", "deterministic") else packed
            runs[mode].append(profile_mode(model, mode, args))
    columns = (*PARTS, "rest", "wall")
    print(f"weights {loaded.weights_dtype}, KV {args.kv_dtype}, {torch.get_num_threads()} threads, "
          f"medians of {args.rounds} rounds, ms a step")
    print("| step | mode | " + " | ".join(columns) + " |\n" + "|---" * (len(columns) + 2) + "|")
    for step in runs[modes[0]][0]:
        for mode in modes:
            cells = [statistics.median(r[step][c] for r in runs[mode]) for c in columns]
            print(f"| {step} | {mode} | " + " | ".join(f"{v:.2f}" for v in cells) + " |")


if __name__ == "__main__":
    main()
