"""The routing decision: the longest cached prefix, balanced against load.

One implementation, used by the Ray Serve request router (``serve_router.py``) and the
simulator (``benchmarks/router_sim.py``); pure Python, no Ray.

``PrefixRouter.rank(namespace, tokens, loads)`` ranks the replicas for a prompt:

1. A replica is *eligible* when its load (requests in flight) is within the balance
   thresholds of the least loaded one: ``load <= min_load + balance_abs`` or
   ``load <= min_load * balance_rel`` (SGLang's router uses the same pair of thresholds,
   globally; here they are per replica, so one hot replica does not switch every request
   to least-loaded routing).
2. Among eligible replicas, each scores the tokens of the prompt it holds cached
   (``PrefixIndex``: whole blocks, in the request's namespace) minus ``load_tokens`` per
   request in flight: a cached prefix is worth what it saves in prefill, a queue what it
   costs in waiting. The best score comes first; a match under ``min_match_blocks``
   blocks counts as none.
3. Ties (most often: a prompt nobody caches, on equally loaded replicas) go to a *home*
   replica chosen by rendezvous hashing, keyed by the prompt's last full block (or the
   request's ``hint``, OpenAI's ``prompt_cache_key``), so the choice is stable and new
   prefixes spread evenly.
4. The rest follow by load: when the first choice is full, the caller takes the next.

The routed prompt's blocks are noted in the index at once (``note_routed``) and replaced
by the replica's own ``BlockStored`` / ``BlockRemoved`` events as they arrive.
"""
from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from radixgate.kv.events.blocks import prompt_block_ids

from .prefix_index import PrefixIndex

Replica = Hashable


@dataclass(frozen=True, slots=True)
class RoutingParams:
    balance_abs: int = 2           # eligible while load <= min_load + balance_abs ...
    balance_rel: float = 1.5       # ... or load <= min_load * balance_rel
    load_tokens: int = 128         # a request in flight costs as much as this many uncached tokens
    min_match_blocks: int = 1      # a shorter cached prefix counts as no match
    routed_ttl_s: float = 30.0     # how long a routed-but-unconfirmed prefix is believed


@dataclass(frozen=True, slots=True)
class Decision:
    ranked: list                   # replicas, best first
    matched_blocks: int            # cached blocks the first choice holds (per the index)
    reason: str                    # "prefix", "home" or "load"
    block_ids: tuple[int, ...]     # the prompt's full blocks (what was noted as routed)


class PrefixRouter:
    def __init__(self, seed: bytes | str, block_size: int,
                 params: RoutingParams = RoutingParams(), index: PrefixIndex | None = None):
        self.seed = seed
        self.block_size = block_size
        self.params = params
        self.index = index if index is not None else PrefixIndex(params.routed_ttl_s)

    def block_ids(self, namespace: str, tokens: Sequence[int]) -> list[int]:
        return prompt_block_ids(self.seed, namespace, tokens, self.block_size)

    def rank(self, namespace: str, tokens: Sequence[int], loads: Mapping[Replica, int],
             hint: str | None = None, note: bool = True) -> Decision:
        """``loads``: requests in flight per candidate replica (non-empty)."""
        ids = self.block_ids(namespace, tokens)
        eligible = self.eligible(loads)
        matched = self.index.match(ids, eligible) if ids else {}
        minimum = self.params.min_match_blocks
        depth_of = {r: d if d >= minimum else 0 for r, d in matched.items()}
        weight, B = self.params.load_tokens, self.block_size
        scores = {r: depth_of.get(r, 0) * B - weight * loads[r] for r in eligible}
        top = max(scores.values())
        tied = [r for r in eligible if scores[r] == top]
        key = hint or (str(ids[-1]) if ids else namespace)
        best = tied[0] if len(tied) == 1 else home_replica(f"{namespace}\x00{key}", tied)
        depth = depth_of.get(best, 0)
        reason = "prefix" if depth else ("home" if len(tied) > 1 else "load")
        ranked = [best] + sorted((r for r in loads if r != best), key=lambda r: loads[r])
        if note and ids:
            self.index.note_routed(best, ids)
        return Decision(ranked, depth, reason, tuple(ids))

    def eligible(self, loads: Mapping[Replica, int]) -> list:
        low = min(loads.values())
        limit = max(low + self.params.balance_abs, low * self.params.balance_rel)
        return [r for r, load in loads.items() if load <= limit]


def home_replica(key: str, replicas: Sequence[Replica]) -> Replica:
    """Rendezvous (highest random weight) hashing: the same key picks the same replica
    while it is a candidate, and removing a replica moves only its own keys."""
    return max(replicas, key=lambda r: hashlib.blake2b(f"{key}\x00{r}".encode(),
                                                        digest_size=8).digest())
