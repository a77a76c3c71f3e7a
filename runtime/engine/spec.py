"""Speculative decoding with drafts from the request's own text (``[spec] mode = "ngram"``).

Decode is memory-bound: a step that checks ``k`` drafted tokens reads the weights once, as a
one-token step does, so every accepted draft token is nearly free. Agent and coding traffic
repeats itself (an edit re-emits a file from the prompt, a tool call copies arguments out of
earlier results), and the request's own prompt and output say what comes next: when the
last ``n`` tokens (``n`` from ``max_ngram`` down to ``min_ngram``) occurred earlier, the
tokens that followed them then are the draft (prompt lookup).

Verification (``EngineCore``): the last sampled token and the drafts run as one
prefix-extend of the sequence; each row is sampled as a plain decode step would sample it,
in order, and the drafts are accepted while the sampled token equals the draft. For a
greedy row that is exactly greedy decoding. For a sampled row it is speculative sampling
with a point-mass draft: the draft is kept with probability p(draft), and on a mismatch the
token drawn is distributed as p with the draft removed, so the output keeps the model's
distribution, and a seeded request draws the same uniforms in the same order as without
drafts. Rejected positions' K/V stay in slots past ``num_computed``: later steps overwrite
them and the tree never sees them.

``Drafter`` adapts ``k`` per request: doubled (up to ``max_draft``) when a whole draft was
accepted, halved when less than half was; after ``pause_after`` verify steps in a row that
accepted nothing it stops drafting for ``pause_steps`` decode steps. The scheduler drafts
only into free blocks (never evicting, never preempting) and within the step's budget.
"""
from __future__ import annotations

from dataclasses import dataclass

SPEC_MODES = ("none", "ngram")


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """``[spec]``: ``mode`` none | ngram; drafts of up to ``max_draft`` tokens after a match
    of ``min_ngram`` .. ``max_ngram`` tokens; ``start_draft`` is each request's first ``k``."""

    mode: str = "none"
    max_draft: int = 8
    start_draft: int = 4
    min_ngram: int = 2
    max_ngram: int = 4
    pause_after: int = 4
    pause_steps: int = 16

    def __post_init__(self) -> None:
        if self.mode not in SPEC_MODES:
            raise ValueError(f"spec mode must be one of {', '.join(SPEC_MODES)}, got {self.mode!r}")
        if not 1 <= self.start_draft <= self.max_draft <= 64:
            raise ValueError("spec needs 1 <= start_draft <= max_draft <= 64")
        if not 1 <= self.min_ngram <= self.max_ngram <= 16:
            raise ValueError("spec needs 1 <= min_ngram <= max_ngram <= 16")
        if self.pause_after < 1 or self.pause_steps < 0:
            raise ValueError("spec needs pause_after >= 1 and pause_steps >= 0")

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


class Drafter:
    """One request's draft source and its adaptive draft length. ``propose(tokens, limit)``
    gives at most ``limit`` tokens (maybe none); ``record(drafted, accepted)`` after each
    verify step. The n-gram index covers ``tokens[:indexed]`` and grows as tokens arrive
    (each n-gram maps to where its most recent earlier occurrence ended)."""

    def __init__(self, config: SpecConfig):
        self.config = config
        self.k = config.start_draft
        self.misses = 0            # verify steps in a row that accepted nothing
        self.paused = 0            # decode steps left without drafting
        self.index: list[dict[tuple[int, ...], int]] = [
            {} for _ in range(config.max_ngram + 1)]
        self.indexed = 0           # n-grams ending before this position are indexed

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        if self.paused > 0:
            self.paused -= 1
            return []
        limit = min(limit, self.k)
        if limit <= 0:
            return []
        self._index(tokens, len(tokens) - 1)
        for n in range(min(self.config.max_ngram, len(tokens) - 1), self.config.min_ngram - 1, -1):
            end = self.index[n].get(tuple(tokens[len(tokens) - n:]))
            if end is not None:
                return tokens[end:end + limit]
        return []

    def record(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        if accepted == 0:
            self.misses += 1
            if self.misses >= self.config.pause_after:
                self.paused, self.misses = self.config.pause_steps, 0
        else:
            self.misses = 0
        if accepted == drafted:
            self.k = min(self.config.max_draft, self.k * 2)
        elif 2 * accepted < drafted:
            self.k = max(1, self.k // 2)

    def _index(self, tokens: list[int], upto: int) -> None:
        """Index every n-gram that ends (exclusive) at a position in (indexed, upto]: the
        query n-gram (ending at len(tokens)) is never among them."""
        low, high = self.config.min_ngram, self.config.max_ngram
        for end in range(max(self.indexed + 1, low), upto + 1):
            for n in range(low, min(high, end) + 1):
                self.index[n][tuple(tokens[end - n:end])] = end
        self.indexed = max(self.indexed, upto)
