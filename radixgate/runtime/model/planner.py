"""KV capacity planner: bytes per token, tokens and concurrent conversations that fit a
memory budget, for a model config (loaded or read from a file) or a named preset.
Bytes per token are radixgate/kv/dtypes.py's formula (the 8-bit KV dtypes' scales included).
Units are binary (KiB = 1024 B, GiB = 2**30 B), so Llama 2 7B at fp16 is 512 KiB/token and
8,192 tokens take 4 GiB. No torch import: ``radixgate plan`` (radixgate/gateway/cli.py) plans
without loading a model.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from radixgate.kv.dtypes import KV_DTYPE_BYTES, kv_bytes_per_token
from radixgate.kv.groups.window_plan import split_pool

GiB, KiB = 2**30, 2**10

@dataclass(frozen=True)
class KVShape:
    """The numbers the KV size depends on; ``layer_windows``: each layer's sliding window
    (0: global; empty: every layer global)."""
    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    layer_windows: tuple[int, ...] = ()

    def kv_bytes_per_token(self, kv_dtype: str | int = 2) -> int:
        """As ``kv_dtype`` (a ``[cache] kv_dtype`` name, scales included, or bytes per number)."""
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, kv_dtype)


PRESETS: dict[str, KVShape] = {s.name: s for s in [
    KVShape("llama-2-7b", 32, 32, 128), KVShape("llama-2-13b", 40, 40, 128),
    KVShape("llama-2-70b", 80, 8, 128), KVShape("llama-3-8b", 32, 8, 128),
    KVShape("llama-3-70b", 80, 8, 128), KVShape("llama-3.1-405b", 126, 8, 128),
    KVShape("qwen2-0.5b", 24, 2, 64),
    KVShape("qwen2-7b", 28, 4, 128), KVShape("qwen2-72b", 80, 8, 128),
    KVShape("smollm2-135m", 30, 3, 64), KVShape("smollm2-360m", 32, 5, 64),
    KVShape("smollm2-1.7b", 24, 32, 64), KVShape("qwen3-0.6b", 28, 8, 128),
    KVShape("qwen3-8b", 36, 8, 128), KVShape("phi-3-mini", 32, 32, 96),
]}


def _windows(num_layers: int, window: int, period: int) -> tuple[int, ...]:
    """Gemma's pattern: of every ``period`` layers the last is global (1: all windowed)."""
    return tuple(0 if period > 1 and i % period == period - 1 else window
                 for i in range(num_layers))


# Sliding-window models: their window layers keep a pool of their own (kv/
# window_plan.py, docs/ARCHITECTURE.md section 9b). Mistral 7B v0.1's 4,096-token window.
PRESETS.update({s.name: s for s in [
    KVShape("mistral-7b", 32, 8, 128, _windows(32, 4096, 1)),
    KVShape("gemma-2-2b", 26, 4, 256, _windows(26, 4096, 2)),
    KVShape("gemma-2-9b", 42, 8, 256, _windows(42, 4096, 2)),
    KVShape("gemma-3-1b", 26, 1, 256, _windows(26, 512, 6)),
    KVShape("gemma-3-4b", 34, 4, 256, _windows(34, 1024, 6)),
]})
PLAN_BLOCK_SIZE = 16
PLAN_STEP_TOKENS = 2048      # the engine's solo step (EngineConfig.solo_step_tokens)


@dataclass(frozen=True)
class Plan:
    name: str
    dtype_bytes: int
    bytes_per_token: int
    memory_bytes: int
    context_tokens: int
    max_tokens: int                  # tokens of KV that fit in memory_bytes
    bytes_per_conversation: int      # context_tokens x bytes_per_token
    max_conversations: int           # whole conversations of context_tokens that fit
    kv_dtype: str = ""               # set when planned for a named KV dtype (scales included)
    window: int = 0                  # the window layers' W, when they have a pool of their own
    window_layers: int = 0
    window_tokens: int = 0           # tokens of the window layers' pool
    window_bytes_per_token: int = 0  # of them (bytes_per_token is then the global layers')

    def held_per_conversation(self, tokens: int) -> int:
        """Bytes one conversation of ``tokens`` holds: every layer's K/V for each token, or
        with a window pool the global layers' for each and the window layers' for the last
        ``W + block`` tokens only."""
        if not self.window:
            return tokens * self.bytes_per_token
        kept = min(tokens, self.window + PLAN_BLOCK_SIZE)
        return tokens * self.bytes_per_token + kept * self.window_bytes_per_token

    def memory_for(self, conversations: int, tokens: int | None = None) -> int:
        """Bytes needed to hold ``conversations`` x ``tokens`` (default: context_tokens)."""
        return conversations * self.held_per_conversation(tokens or self.context_tokens)


def shape_of(config_or_name) -> KVShape:
    """A preset name, a ``ModelConfig`` (or anything with num_layers/num_kv_heads/head_dim),
    a GGUF file or an HF directory."""
    if isinstance(config_or_name, KVShape):
        return config_or_name
    if isinstance(config_or_name, (str, Path)):
        key = str(config_or_name).lower()
        if key in PRESETS:
            return PRESETS[key]
        return shape_of_path(Path(config_or_name))
    c = config_or_name
    return KVShape(getattr(c, "arch", "model"), c.num_layers, c.num_kv_heads, c.head_dim,
                   tuple(getattr(c, "layer_windows", ()) or ()))


def shape_of_path(path: Path) -> KVShape:
    if str(path) == "default":
        from radixgate.runtime.model.loader import default_model_path
        path = default_model_path()
    if path.is_dir():
        from radixgate.runtime.model.loader_hf import read_hf_config
        return replace(shape_of(read_hf_config(path)), name=path.name)
    if path.is_file():
        from radixgate.runtime.model.loader_gguf import read_gguf_config
        return replace(shape_of(read_gguf_config(path)), name=path.stem)
    raise ValueError(f"unknown model {str(path)!r}: not a preset ({', '.join(PRESETS)}), "
                     f"a GGUF file or an HF directory")


def plan(config_or_name, memory_gb: float, context_tokens: int, dtype_bytes: int = 2,
         kv_dtype: str | None = None, window_ratio: float = 0.0) -> Plan:
    """How much KV fits in ``memory_gb`` GiB for conversations of ``context_tokens``;
    ``kv_dtype`` (float32 | bfloat16 | float16 | int8 | fp8) replaces ``dtype_bytes``. A
    model with sliding-window layers is planned as the engine sizes it
    (``kv.groups.window_plan.split_pool``: ``window_ratio`` 0 auto, 1 one pool)."""
    shape = shape_of(config_or_name)
    per_token = shape.kv_bytes_per_token(kv_dtype or dtype_bytes)
    if kv_dtype:
        dtype_bytes = KV_DTYPE_BYTES[kv_dtype]
    memory = int(memory_gb * GiB)
    layer_token = per_token // shape.num_layers
    split = split_pool(memory, layer_token * PLAN_BLOCK_SIZE, shape.num_layers,
                       shape.layer_windows, block_size=PLAN_BLOCK_SIZE, context=context_tokens,
                       step_tokens=min(PLAN_STEP_TOKENS, context_tokens), ratio=window_ratio)
    if not split.pooled:
        max_tokens = memory // per_token
        return Plan(shape.name, dtype_bytes, per_token, memory, context_tokens, max_tokens,
                    per_token * context_tokens,
                    max_tokens // context_tokens if context_tokens else 0, kv_dtype or "")
    main = layer_token * (shape.num_layers - len(split.window_layers))
    window = layer_token * len(split.window_layers)
    max_tokens = split.main_blocks * PLAN_BLOCK_SIZE
    window_tokens = split.window_blocks * PLAN_BLOCK_SIZE
    each = min(context_tokens, split.window + PLAN_BLOCK_SIZE)
    fit = min(max_tokens // context_tokens, window_tokens // each) if context_tokens else 0
    result = Plan(shape.name, dtype_bytes, main, memory, context_tokens, max_tokens, 0, fit,
                  kv_dtype or "", split.window, len(split.window_layers), window_tokens, window)
    return replace(result, bytes_per_conversation=result.held_per_conversation(context_tokens))


def _size(num_bytes: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", 2**20), ("KiB", KiB)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:,.1f} {unit}".replace(".0 ", " ")
    return f"{num_bytes:,.0f} B"


def _window_cell(p: Plan) -> str:
    """The window layers' pool: W, layers, tokens and bytes per token; "-" without one
    (KV/token is then every layer's; with one, the global layers')."""
    if not p.window:
        return "-"
    return (f"W={p.window:,} x{p.window_layers}: {p.window_tokens:,} tok, "
            f"{_size(p.window_bytes_per_token)}/tok")


def _kv_cell(p: Plan) -> str:
    """KV/token; marked ``*`` where every layer is windowed (no KV grows with the context)."""
    return _size(p.bytes_per_token) + ("*" if _all_windowed(p) else "")


def _all_windowed(p: Plan) -> bool:
    return bool(p.window) and p.bytes_per_token == 0


def _all_windowed_notes(plans: list[Plan]) -> list[str]:
    """One line under the table for each model whose every layer is windowed: why its
    KV/token is 0 B, and where its KV is."""
    return [f"* {p.name}: every layer has a {p.window:,}-token sliding window, so no KV grows "
            f"with the context: each conversation keeps its last "
            f"{min(p.context_tokens, p.window + PLAN_BLOCK_SIZE):,} tokens in the window pool "
            f"(its bytes per token: the window pool column)"
            for p in {p.name: p for p in plans if _all_windowed(p)}.values()]


def format_plan_table(plans: list[Plan], conversations: int | None = None) -> str:
    """A fixed-width table: one row per plan; with ``conversations``, the memory they need.
    A model whose every layer is windowed shows KV/token ``0 B*`` and a note that says why."""
    header = ["model", "KV/token", f"per {plans[0].context_tokens:,} tok" if plans else "per ctx",
              "budget", "tokens fit", "conversations fit", "window pool"]
    if conversations:
        header.append(f"{conversations} conv need")
    rows = [header]
    for p in plans:
        row = [f"{p.name} ({p.kv_dtype})" if p.kv_dtype else p.name, _kv_cell(p), _size(p.bytes_per_conversation),
               _size(p.memory_bytes), f"{p.max_tokens:,}", f"{p.max_conversations:,}",
               _window_cell(p)]
        if conversations:
            row.append(_size(p.memory_for(conversations)))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + _all_windowed_notes(plans))
