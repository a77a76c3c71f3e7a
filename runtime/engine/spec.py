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

Drafts also come from the namespace's earlier requests (``NamespaceDrafts``): what an
earlier request of the same namespace went on to say after the same last tokens, when the
request's own text has no match. Each namespace (a tenant, a ``cache_salt``) has its own
store, so a draft never holds another namespace's tokens. The stores share one token budget
(``[spec] namespace_tokens``), the least recently fed sequences go first, and a flush of a
namespace (or of all) drops its store with its cache.

``Drafter`` picks ``k`` per request and step from what drafting costs and what it has
kept. Checking a draft token is not free on a CPU: torch's int4 op dequantizes the weights
for every block of rows and the head scores every row, so each extra row costs about
``row_cost`` (0.17) of a one-row step (Ice Lake, default model at 600 positions: 1 row
24.4 ms, 9 rows 58.4, 17 rows 99.4: 0.16-0.17 a row). Under a geometric model the i-th draft token is
kept with probability alpha^i, alpha the request's recent acceptance (decayed counts, a
prior of 1/2). With B rows decoding, a draft token adds one row to a step of ~B, so it pays
when alpha^i >= theta(B) = B x / (1 + B x), x = row_cost / (1 - row_cost): theta is 0.17
for one stream, 0.45 for 4, 0.77 for 16. ``k`` is the largest such i (at most ``max_draft``);
when that is 0 for ``probe_every`` decode steps in a row, one token is drafted to learn
whether alpha has risen.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

SPEC_MODES = ("none", "ngram")


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """``[spec]``: ``mode`` none | ngram; drafts of up to ``max_draft`` tokens after a match
    of ``min_ngram`` .. ``max_ngram`` tokens, as long as ``Drafter.draft_length`` says they
    pay (``row_cost``, ``probe_every``); ``namespace_tokens`` bounds ``NamespaceDrafts``."""

    mode: str = "none"
    max_draft: int = 8
    min_ngram: int = 2
    max_ngram: int = 4
    row_cost: float = 0.17             # an extra row's cost, as a share of a one-row step
    probe_every: int = 16              # decode steps without drafts before a 1-token probe
    namespace_tokens: int = 65536      # finished requests' tokens kept for drafting (0: off)

    def __post_init__(self) -> None:
        if self.mode not in SPEC_MODES:
            raise ValueError(f"spec mode must be one of {', '.join(SPEC_MODES)}, got {self.mode!r}")
        if not 1 <= self.max_draft <= 64:
            raise ValueError("spec needs 1 <= max_draft <= 64")
        if not 1 <= self.min_ngram <= self.max_ngram <= 16:
            raise ValueError("spec needs 1 <= min_ngram <= max_ngram <= 16")
        if not 0.0 < self.row_cost < 1.0 or self.probe_every < 1 or self.namespace_tokens < 0:
            raise ValueError("spec needs 0 < row_cost < 1, probe_every >= 1 and "
                             "namespace_tokens >= 0")

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


class Drafter:
    """One request's draft source and draft length. ``propose(tokens, limit, ...)`` gives
    at most ``limit`` tokens (maybe none); ``record(drafted, accepted)`` after each verify
    step. The n-gram index covers ``tokens[:indexed]`` and grows as tokens arrive (each
    n-gram maps to where its most recent earlier occurrence ended)."""

    DECAY = 0.8                # weight of the older counts at each verify step

    def __init__(self, config: SpecConfig):
        self.config = config
        self.kept = self.missed = 0.0    # decayed counts: tokens kept, drafts cut short
        self.idle = 0                    # decode steps in a row with k = 0
        self.index: list[dict[tuple[int, ...], int]] = [
            {} for _ in range(config.max_ngram + 1)]
        self.indexed = 0           # n-grams ending before this position are indexed

    @property
    def alpha(self) -> float:
        """The estimated chance that each next draft token is kept (prior 1/2)."""
        return (self.kept + 1.0) / (self.kept + self.missed + 2.0)

    def draft_length(self, limit: int, batch: int = 1) -> int:
        """The k that pays with ``batch`` rows decoding (the module docstring's rule)."""
        x = self.config.row_cost / (1.0 - self.config.row_cost)
        theta = batch * x / (1.0 + batch * x)
        k = int(math.log(theta) / math.log(self.alpha)) if self.alpha < 1.0 else limit
        k = max(0, min(k, limit, self.config.max_draft))
        if k > 0:
            self.idle = 0
            return k
        self.idle += 1
        if self.idle >= self.config.probe_every and limit > 0:
            self.idle = 0
            return 1
        return 0

    def propose(self, tokens: list[int], limit: int, shared: "NamespaceDrafts | None" = None,
                namespace: str = "", batch: int = 1) -> list[int]:
        """Up to ``draft_length(limit, batch)`` tokens after the longest recent match in
        ``tokens`` itself, else in ``shared``'s store of ``namespace``."""
        limit = self.draft_length(limit, batch)
        if limit <= 0:
            return []
        self._index(tokens, len(tokens) - 1)
        for n in range(min(self.config.max_ngram, len(tokens) - 1), self.config.min_ngram - 1, -1):
            end = self.index[n].get(tuple(tokens[len(tokens) - n:]))
            if end is not None:
                return tokens[end:end + limit]
        return shared.propose(namespace, tokens, limit) if shared is not None else []

    def record(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.kept = self.kept * self.DECAY + accepted
        self.missed = self.missed * self.DECAY + (accepted < drafted)

    def _index(self, tokens: list[int], upto: int) -> None:
        """Index every n-gram that ends (exclusive) at a position in (indexed, upto]: the
        query n-gram (ending at len(tokens)) is never among them."""
        low, high = self.config.min_ngram, self.config.max_ngram
        for end in range(max(self.indexed + 1, low), upto + 1):
            for n in range(low, min(high, end) + 1):
                self.index[n][tuple(tokens[end - n:end])] = end
        self.indexed = max(self.indexed, upto)


class NamespaceDrafts:
    """Finished requests' tokens by namespace, for drafting (see the module docstring).
    Each stored sequence indexes its n-grams (``min_ngram`` .. ``max_ngram``) by hash, each
    mapping to (sequence, end) of its latest occurrence; an entry whose sequence has been
    dropped, or whose tokens do not match on lookup (a hash collision), is skipped."""

    def __init__(self, config: SpecConfig):
        self.config = config
        self.budget = config.namespace_tokens
        self.tokens = 0
        self.sequences: dict[int, tuple[str, list[int]]] = {}    # id -> (namespace, tokens)
        self.index: dict[str, dict[int, int]] = {}              # namespace -> hash -> packed
        self._next = 0

    def add(self, namespace: str, tokens: list[int]) -> None:
        if self.budget <= 0 or len(tokens) < self.config.min_ngram + 1:
            return
        tokens = list(tokens[-self.budget:])
        self._next += 1
        key = self._next
        self.sequences[key] = (namespace, tokens)
        self.tokens += len(tokens)
        grams = self.index.setdefault(namespace, {})
        for end, gram in self._grams(tokens):
            grams[gram] = (key << 32) | end
        while self.tokens > self.budget:
            self._drop(next(iter(self.sequences)))

    def _grams(self, tokens: list[int]):
        """(end, hash) of every n-gram of ``tokens`` with a token after it."""
        low, high = self.config.min_ngram, self.config.max_ngram
        for end in range(low, len(tokens)):
            for n in range(low, min(high, end) + 1):
                yield end, hash(tuple(tokens[end - n:end]))

    def propose(self, namespace: str, tokens: list[int], limit: int) -> list[int]:
        grams = self.index.get(namespace)
        if not grams:
            return []
        for n in range(min(self.config.max_ngram, len(tokens)), self.config.min_ngram - 1, -1):
            tail = tuple(tokens[len(tokens) - n:])
            packed = grams.get(hash(tail))
            if packed is None:
                continue
            stored = self.sequences.get(packed >> 32)
            end = packed & 0xFFFFFFFF
            if stored is None or stored[0] != namespace or tuple(stored[1][end - n:end]) != tail:
                continue
            return stored[1][end:end + limit]
        return []

    def drop_namespace(self, namespace: str | None = None) -> None:
        """Forget ``namespace``'s sequences (all namespaces when None): its cache was flushed."""
        for key in [k for k, (ns, _) in self.sequences.items() if namespace in (None, ns)]:
            self._drop(key)

    def _drop(self, key: int) -> None:
        """Forget one sequence and the index entries still pointing at it."""
        namespace, tokens = self.sequences.pop(key)
        self.tokens -= len(tokens)
        grams = self.index.get(namespace)
        if grams is None:
            return
        for end, gram in self._grams(tokens):
            if grams.get(gram) == (key << 32) | end:
                del grams[gram]
        if not grams:
            del self.index[namespace]
