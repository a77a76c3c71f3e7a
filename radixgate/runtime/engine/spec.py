"""Speculative decoding with drafts from the request's own text (``[spec] mode = "ngram"``,
the default; ``"none"`` or ``--spec none`` turns it off, a request with ``speculative: false``).

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

Drafts also come from the namespace's cached paths (``NamespaceDrafts``): what an earlier
request of the same namespace went on to say after the same last tokens, when the request's
own text has no match. The index follows the radix tree's cache events: a new node's tokens
are indexed, an evicted (or flushed) block's entries go with it. Each namespace (a tenant, a
``cache_salt``) has its own index, so a draft never holds another namespace's tokens; all
share one budget of indexed tokens (``[spec] namespace_tokens``, oldest blocks first).

``Drafter`` picks ``k`` per request and step from what drafting costs and what it has
kept. Checking a draft token is not free on a CPU: torch's int4 op dequantizes the weights
for every block of rows and the head scores every row, so each extra row costs about
``row_cost`` of a one-row step: 0.16-0.17 a row on Ice Lake through torch's int4 op (default
model at 600 positions: 1 row 24.4 ms, 9 rows 58.4, 17 rows 99.4); 0.085 on Sapphire Rapids
through ``native_int4_fixed.c`` (1 row 13.5 ms, 5 rows 18.0: ``benchmarks.step_profile``),
so the default is 0.10. Under a geometric model the i-th draft token is
kept with probability alpha^i, alpha the request's recent acceptance (decayed counts, a
prior of 1/2). With B rows decoding, a draft token adds one row to a step of ~B, so it pays
when alpha^i >= theta(B) = B x / (1 + B x), x = row_cost / (1 - row_cost): theta is 0.17
for one stream, 0.45 for 4, 0.77 for 16. ``k`` is the largest such i (at most ``max_draft``);
when that is 0 for ``probe_every`` decode steps in a row (times B // 4 from 8 rows on), one
token is drafted to learn whether alpha has risen.
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

    mode: str = "ngram"                # on by default: it never loses (benchmarks/RESULTS.md)
    max_draft: int = 8
    min_ngram: int = 2
    max_ngram: int = 4
    row_cost: float = 0.10             # an extra row's cost, as a share of a one-row step
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
        # a probe adds a row to a step of ``batch``: rarer as the batch grows (16 streams
        # ran at 0.98x with drafts on, probing every 16 steps)
        if self.idle >= self.config.probe_every * max(1, batch // 4) and limit > 0:
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
    """An n-gram index over each namespace's cached paths, kept in step with the tree
    through its cache events (``on_event``): a ``stored`` event of a new node indexes the
    node's tokens (each n-gram, ``min_ngram`` .. ``max_ngram`` long, maps by hash to where
    it ends in the node's own tokens, so its continuation is what the path went on to say),
    registered under the block that holds the n-gram's last token; a ``removed`` event
    (eviction, a flush, a replaced block) deletes the entries of its blocks. Each namespace
    has its own index. Past ``namespace_tokens`` indexed tokens the oldest blocks' entries
    go first. A lookup checks the n-gram's tokens (a hash collision answers nothing)."""

    def __init__(self, config: SpecConfig, block_size: int):
        self.config, self.block_size = config, block_size
        self.budget = config.namespace_tokens
        self.tokens = 0                                  # positions indexed now
        self.index: dict[str, dict[int, tuple]] = {}    # namespace -> hash -> (piece, end, block)
        self.blocks: dict[int, tuple[str, list[int], int]] = {}   # block -> (ns, hashes, count)

    def on_event(self, event) -> None:
        """A ``kv.CacheEvent`` of the tree."""
        if event.kind == "removed":
            for block in event.blocks:
                self._drop(block)
        elif event.tokens and self.budget > 0:
            self._store(event)

    def _store(self, event) -> None:
        reach = self.config.max_ngram - 1                # earlier tokens the first n-grams need
        first = max(0, event.start - reach)
        piece = memoryview(bytes(event.tokens[first * 4:event.end * 4])).cast("i")
        grams = self.index.setdefault(event.namespace, {})
        block_size = self.block_size
        low, high = self.config.min_ngram, self.config.max_ngram
        for i, block in enumerate(event.blocks):
            self._drop(block)                            # a reused block id: its old entries
            begin = max(event.start, (event.start // block_size + i) * block_size)
            stop = min(event.end, begin - begin % block_size + block_size)
            hashes = []
            for last in range(begin, stop):              # n-grams ending with token ``last``
                end = last + 1 - first                   # position after it, in ``piece``
                if end >= len(piece):
                    break                                 # no continuation inside this node
                for n in range(low, min(high, end) + 1):
                    key = hash(tuple(piece[end - n:end]))
                    grams[key] = (piece, end, block)
                    hashes.append(key)
            self.blocks[block] = (event.namespace, hashes, stop - begin)
            self.tokens += stop - begin
        while self.tokens > self.budget and self.blocks:
            self._drop(next(iter(self.blocks)))

    def _drop(self, block: int) -> None:
        entry = self.blocks.pop(block, None)
        if entry is None:
            return
        namespace, hashes, count = entry
        grams = self.index.get(namespace, {})
        for key in hashes:
            value = grams.get(key)
            if value is not None and value[2] == block:
                del grams[key]
        self.tokens -= count
        if not grams:
            self.index.pop(namespace, None)

    def propose(self, namespace: str, tokens: list[int], limit: int) -> list[int]:
        grams = self.index.get(namespace)
        if not grams:
            return []
        for n in range(min(self.config.max_ngram, len(tokens)), self.config.min_ngram - 1, -1):
            tail = tuple(tokens[len(tokens) - n:])
            found = grams.get(hash(tail))
            if found is None:
                continue
            piece, end, _ = found
            if tuple(piece[end - n:end]) == tail:
                return list(piece[end:end + limit])
        return []
