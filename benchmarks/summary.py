"""Per-workload summary of request results, shared by the HTTP runner and the peers."""
from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")


def spread_sample(items: Sequence[T], n: int | None) -> list[T]:
    """``n`` items at evenly spaced positions, first and last included, in order (all of
    them when ``n`` is None or not smaller): a sample of a session workload that has early
    turns (short histories) and late ones alike, unlike its first ``n`` requests."""
    if n is None or n >= len(items):
        return list(items)
    if n <= 1:
        return list(items[:n])
    step = (len(items) - 1) / (n - 1)
    return [items[round(i * step)] for i in range(n)]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile ``q`` in [0, 100]; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 1)


def summarize(results: Sequence[dict], wall_s: float) -> dict:
    """``results``: dicts with ok, prompt_tokens, cache_read_tokens, output_tokens, ttft_s,
    itl_s (seconds or None). Token totals, rates and percentiles cover successful requests
    only (``errors`` says how many failed; ``hit_rate`` is None when none succeeded)."""
    ok = [r for r in results if r["ok"]]
    prompt = sum(r["prompt_tokens"] for r in ok)
    read = sum(r["cache_read_tokens"] for r in ok)
    output = sum(r["output_tokens"] for r in ok)
    ttfts = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    itls = [r["itl_s"] for r in ok if r["itl_s"] is not None]
    return {
        "requests": len(results), "errors": len(results) - len(ok),
        "error_samples": [r.get("error", "") for r in results if not r["ok"]][:3],
        "prompt_tokens": prompt, "cache_read_tokens": read, "prefill_tokens": prompt - read,
        "hit_rate": read / prompt if prompt else None, "output_tokens": output,
        "ttft_ms": {"p50": _ms(percentile(ttfts, 50)), "p95": _ms(percentile(ttfts, 95)),
                    "p99": _ms(percentile(ttfts, 99))},
        "itl_ms": {"mean": _ms(sum(itls) / len(itls)) if itls else None,
                   "p50": _ms(percentile(itls, 50)), "p95": _ms(percentile(itls, 95))},
        "wall_s": round(wall_s, 2),
        "throughput": {"requests_per_s": round(len(ok) / wall_s, 3) if wall_s else None,
                       "output_tok_per_s": round(output / wall_s, 1) if wall_s else None,
                       "prompt_tok_per_s": round(prompt / wall_s, 1) if wall_s else None},
    }
