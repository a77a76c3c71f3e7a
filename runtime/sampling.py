"""Token sampling: greedy, temperature, top-k, top-p, per-request seeded generators.

Each request owns a ``torch.Generator`` (seeded from ``SamplingParams.seed`` or at random),
so a seeded request samples the same tokens whatever else shares its batch.

Edge values are safe per row, so one request's numbers can never fail its batch:

- a temperature below ``MIN_TEMPERATURE`` (1e-5; 0, ``1e-39``, ``5e-324`` ...) is greedy:
  dividing by it would overflow the logits to inf and the softmax to NaN;
- NaN logits count as ``-inf`` (never picked); a sampled row is scaled after subtracting its
  largest logit, so huge logits cannot overflow either;
- a row with no finite logit picks greedily over the row with NaN as ``-inf``: the first
  ``+inf`` when there is one, else token 0 (a row of only ``-inf``/NaN).
"""
from __future__ import annotations

import random

import torch

from .api import SamplingParams
from .stop import stop_problem

MIN_TEMPERATURE = 1e-5   # below it a request is greedy


def validate_sampling(params: SamplingParams, vocab_size: int) -> str | None:
    """Returns a message describing the first invalid value, or None when all are valid."""
    if params.max_tokens < 1:
        return "max_tokens must be at least 1"
    if params.temperature < 0 or params.temperature != params.temperature:
        return "temperature must be >= 0"
    if not 0.0 < params.top_p <= 1.0:
        return "top_p must lie in (0, 1]"
    if params.top_k < 0:
        return "top_k must be >= 0"
    if any(not isinstance(s, str) or not s for s in params.stop):
        return "stop strings must be non-empty strings"
    if (problem := stop_problem(params.stop)) is not None:
        return problem
    if any(not 0 <= t < vocab_size for t in params.stop_token_ids):
        return "stop_token_ids must be token ids of the model's vocabulary"
    return None


def is_greedy(params: SamplingParams) -> bool:
    """True when ``params`` picks the argmax (temperature below ``MIN_TEMPERATURE``)."""
    return params.temperature < MIN_TEMPERATURE


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A CPU generator for sampled requests (None for greedy ones: they need no randomness)."""
    if is_greedy(params):
        return None
    seed = params.seed if params.seed is not None else random.getrandbits(63)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed)
    return generator


def sample_tokens(logits: torch.Tensor, params: list[SamplingParams],
                  generators: list[torch.Generator | None]) -> list[int]:
    """Picks one token per row. logits: [n, vocab]; returns n token ids."""
    n = logits.shape[0]
    greedy_rows = [i for i in range(n) if is_greedy(params[i])]
    result = [0] * n
    if greedy_rows:
        if len(greedy_rows) == n:
            return greedy_tokens(logits)
        picked = greedy_tokens(logits[greedy_rows])
        for row, token in zip(greedy_rows, picked):
            result[row] = token
    for row in range(n):
        if not is_greedy(params[row]):
            result[row] = _sample_row(logits[row], params[row], generators[row])
    return result


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """Argmax of each row of logits [n, vocab], NaN counted as -inf. torch's argmax picks
    a NaN over every number, so only the rows whose pick is NaN (rare) are redone."""
    picked = logits.argmax(dim=-1)                                   # [n]
    is_nan = logits.gather(-1, picked[:, None]).squeeze(-1).isnan()  # [n]
    if bool(is_nan.any()):
        picked[is_nan] = _nan_to_neg_inf(logits[is_nan]).argmax(dim=-1)
    return picked.tolist()


def _sample_row(row: torch.Tensor, params: SamplingParams,
               generator: torch.Generator | None) -> int:
    """row: [vocab]. Temperature, then top-k, then top-p, then a draw from the generator."""
    row = _nan_to_neg_inf(row.float().cpu())  # [V]
    top = row.max()
    if not torch.isfinite(top):               # a +inf, or nothing finite: no distribution
        return int(row.argmax())
    masked = row == float("-inf")             # [V] never drawn
    scaled = ((row - top) / params.temperature).masked_fill(masked, float("-inf"))  # [V], max 0
    if 0 < params.top_k < scaled.shape[0]:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)  # [V], finite: the largest entry is exp(0)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def _nan_to_neg_inf(logits: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(logits.isnan(), float("-inf"))


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keeps the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    sorted_probs, order = torch.sort(probs, descending=True)  # [V], [V]
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs[mass_before >= top_p] = 0.0
    filtered = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return filtered / filtered.sum()


def top2_gaps(logits: torch.Tensor) -> list[float]:
    """Difference between the best and second-best logit of each row (near-tie detection)."""
    top = torch.topk(logits.float(), 2, dim=-1).values  # [n, 2]
    return (top[:, 0] - top[:, 1]).tolist()
