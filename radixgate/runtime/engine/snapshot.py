"""``EngineSnapshot``: an immutable picture of the engine, published between steps.

HTTP handlers read the latest snapshot without touching the tree or the pool (which belong
to the engine thread). Block states are disjoint, by precedence in_use > pinned > cached >
free, and add up to ``total``.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True, slots=True)
class BlockCounts:
    total: int
    free: int
    cached: int      # held by tree nodes only (evictable cache)
    pinned: int      # on paths to unexpired pins, not used by a running request
    in_use: int      # in a running request's block table


@dataclass(frozen=True, slots=True)
class TreeCounts:
    nodes: int
    cached_tokens: int
    evictable_tokens: int
    pinned_tokens: int
    namespaces: int = 0      # live namespaces (unused ones are dropped; capped per tenant)


@dataclass(frozen=True, slots=True)
class TenantCounts:
    running: int = 0
    waiting: int = 0
    pinned_tokens: int = 0


@dataclass(frozen=True, slots=True)
class PrefixEntry:
    tenant: str          # the pin's owner, else the tenant whose requests opened the namespace
    namespace: str
    length: int
    hits: int
    pin_ttl_s: float
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ReplicaCounts:
    """One engine replica of a scale-out deployment (``radixgate/cluster/``), as the gateway sees it."""

    replica: str
    blocks: BlockCounts
    hit_rate: float          # cached / prompt tokens of the requests it finished
    running: int
    waiting: int
    in_flight: int = 0       # requests the router sent it that have not finished
    indexed_blocks: int = 0  # its blocks in the router's prefix index (from its KV events)
    stale: bool = False      # it missed the last snapshot request: counts from its last report


SPEC_KEYS = ("steps", "drafted", "accepted")


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    time: float                      # time.monotonic() when taken
    block_size: int
    blocks: BlockCounts
    tree: TreeCounts
    running: int
    waiting: int
    tenants: Mapping[str, TenantCounts]
    evictions: Mapping[str, int]     # evicted nodes by reason: lru / ttl / flush
    top_prefixes: tuple[PrefixEntry, ...]
    prefill_tokens_per_s: float      # measured over recent prefill steps (0 before any)
    steps: int = 0
    finished: int = 0
    errors: int = 0
    draining: bool = False
    preemptions: int = 0
    step_time_s: float = 0.0         # total time inside steps since start
    forward_time_s: float = 0.0      # of which in the model forward (overhead = the rest)
    pins: tuple[PrefixEntry, ...] = ()   # every unexpired pin (admin listing), by namespace
    # each tenant's own hottest prefixes, from its own namespaces only (``top_prefixes`` is
    # the server-wide list, for the admin)
    tenant_prefixes: Mapping[str, tuple[PrefixEntry, ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    kv_dtype: str = ""               # the KV cache's element type (radixgate/runtime/model/kv_cache.py)
    kv_bytes_per_token: int = 0      # its bytes per token, every layer, K and V, scales included
    tier: object = None              # the lower KV tier's TierStats (radixgate/kv/tiers/disk/), or None
    hit_tokens: Mapping[str, int] = field(     # prompt tokens reused, by tier: memory / disk
        default_factory=lambda: MappingProxyType({"memory": 0, "disk": 0}))
    replicas: tuple[ReplicaCounts, ...] = ()   # scale-out only: each replica (sums above)
    spec: Mapping[str, int] = field(           # speculative decoding: verify steps, draft
        default_factory=lambda: MappingProxyType(dict.fromkeys(SPEC_KEYS, 0)))  # tokens, kept
    kv_bytes: int = 0                # bytes the KV tensors take (both pools)
    window_pool: Mapping | None = None   # the window layers' pool (window_pool_counts), or None


@dataclass(frozen=True, slots=True)
class EngineShape:
    """An engine's fixed sizes (``EngineCore.shape``): what its callers size requests by."""

    block_size: int
    num_blocks: int          # KV blocks of the main pool
    max_model_len: int       # the context window: prompt + output at most
    kv_dtype: str
    kv_bytes_per_token: int


def empty_snapshot(total_blocks: int, block_size: int, kv_dtype: str = "",
                   kv_bytes_per_token: int = 0) -> EngineSnapshot:
    return EngineSnapshot(time.monotonic(), block_size, BlockCounts(total_blocks, total_blocks, 0, 0, 0),
                          TreeCounts(0, 0, 0, 0), 0, 0, MappingProxyType({}),
                          MappingProxyType({}), (), 0.0, kv_dtype=kv_dtype,
                          kv_bytes_per_token=kv_bytes_per_token)


PREFILL_HALF_LIFE_TOKENS = 4096


@dataclass(slots=True)
class EngineCounters:
    """Mutable counters the engine thread keeps; frozen into each snapshot."""

    steps: int = 0
    finished: int = 0
    errors: int = 0
    preemptions: int = 0
    prefill_rate: float = 0.0   # recent prompt tokens computed / step seconds spent on them
    recent_prefill_tokens: float = 0.0   # those tokens, older work fading (record_prefill)
    recent_prefill_s: float = 0.0        # and those seconds
    step_s: float = 0.0         # wall time inside steps
    forward_s: float = 0.0      # of which inside the model's forward
    stalls: int = 0             # waits with requests queued and none able to start
    spec_steps: int = 0         # decode steps that verified drafts (radixgate/runtime/engine/spec.py)
    spec_drafted: int = 0       # draft tokens checked
    spec_accepted: int = 0      # of which kept

    def record_spec(self, drafted: int, accepted: int) -> None:
        self.spec_steps += 1
        self.spec_drafted += drafted
        self.spec_accepted += accepted

    def record_prefill(self, tokens: int, seconds: float) -> None:
        """``tokens`` prompt tokens were computed in ``seconds`` of a step. The rate is
        tokens over seconds of the recent prefill work, each step weighted by its tokens
        (a mean of per-step rates lets the many small steps, whose fixed cost dominates,
        pull it far under what a long prompt runs at: 283 tok/s shown where a cold
        1,500-token prompt ran at 850); work fades by half every
        ``PREFILL_HALF_LIFE_TOKENS`` tokens prefilled after it."""
        if tokens <= 0 or seconds <= 0:
            return
        keep = 0.5 ** (tokens / PREFILL_HALF_LIFE_TOKENS)
        self.recent_prefill_tokens = self.recent_prefill_tokens * keep + tokens
        self.recent_prefill_s = self.recent_prefill_s * keep + seconds
        self.prefill_rate = self.recent_prefill_tokens / self.recent_prefill_s


def take_snapshot(tree, pool, scheduler, counters: EngineCounters, *, top_n: int,
                  draining: bool, kv_dtype: str = "", kv_bytes_per_token: int = 0,
                  tier=None, hit_tokens: Mapping[str, int] | None = None,
                  kv=None, window_pool: Mapping | None = None) -> EngineSnapshot:
    """Reads tree, pool and scheduler (engine thread only) into an immutable snapshot.
    Nothing here walks the tree or grows with the cache: tree counters are kept current
    (``block_counts``), each tenant's hottest prefixes come from a bounded search of its own
    namespaces, and the pins listed are bounded by the pin quotas."""
    stats = tree.stats(per_namespace=False)
    blocks = block_counts(tree, pool, scheduler.running, stats)
    tree_counts = TreeCounts(stats.nodes, stats.cached_tokens, stats.evictable_tokens,
                             stats.pinned_tokens, stats.num_namespaces)
    by_tenant = _tenant_prefix_entries(tree, top_n)
    return EngineSnapshot(
        time=time.monotonic(), block_size=pool.block_size, blocks=blocks, tree=tree_counts,
        running=len(scheduler.running), waiting=scheduler.num_waiting,
        tenants=MappingProxyType(_tenant_counts(tree, scheduler)),
        evictions=MappingProxyType(dict(stats.evictions)),
        top_prefixes=_server_top(by_tenant, top_n),
        tenant_prefixes=MappingProxyType(by_tenant),
        prefill_tokens_per_s=counters.prefill_rate, steps=counters.steps,
        finished=counters.finished, errors=counters.errors, draining=draining,
        preemptions=counters.preemptions,
        step_time_s=counters.step_s, forward_time_s=counters.forward_s,
        pins=tuple(_pin_entries(tree)), kv_dtype=kv_dtype, kv_bytes_per_token=kv_bytes_per_token,
        tier=tier, hit_tokens=MappingProxyType(dict(hit_tokens or {"memory": 0, "disk": 0})),
        spec=MappingProxyType({"steps": counters.spec_steps, "drafted": counters.spec_drafted,
                               "accepted": counters.spec_accepted}),
        kv_bytes=kv.nbytes if kv is not None else 0,
        window_pool=window_pool)


def block_counts(tree, pool, running, stats) -> BlockCounts:
    """The disjoint block states from the tree's kept counters (``stats``), looking at the
    running requests' blocks and the pinned ones (bounded by the pin quotas), never at
    every cached block: pinned blocks are held by nodes, so cached = held - held in use -
    pinned not in use."""
    in_use = {block for seq in running for block in seq.kv.block_table}
    pinned = tree.pinned_blocks()
    pinned_free = len(pinned) - sum(1 for block in in_use if block in pinned)
    held_in_use = sum(1 for block in in_use if block in tree.block_holders)
    cached = stats.cached_blocks - held_in_use - pinned_free
    return BlockCounts(pool.num_blocks, pool.num_free(), cached, pinned_free, len(in_use))


def _tenant_counts(tree, scheduler) -> dict[str, TenantCounts]:
    tenants = set(scheduler.running_by_tenant) | set(scheduler.waiting)
    tenants |= {node.pin.owner for node in tree.pinned_nodes if node.pin is not None and node.pin.owner}
    return {t: TenantCounts(running=scheduler.running_by_tenant.get(t, 0),
                            waiting=scheduler.waiting_of(t),
                            pinned_tokens=tree.pinned_tokens(t))
            for t in sorted(tenants)}


def _tenant_prefix_entries(tree, top_n: int) -> dict[str, tuple[PrefixEntry, ...]]:
    """Tenant -> its ``top_n`` hottest prefixes (own namespaces only; tenants with none
    are left out)."""
    return {tenant: tuple(PrefixEntry(tenant=info.owner or info.tenant, namespace=info.namespace,
                                      length=info.length, hits=info.hits,
                                      pin_ttl_s=info.pin_ttl_s, token_ids=tuple(info.tokens))
                          for info in infos)
            for tenant, infos in tree.top_prefixes_by_tenant(top_n).items()}


def _server_top(by_tenant: Mapping[str, tuple[PrefixEntry, ...]],
                top_n: int) -> tuple[PrefixEntry, ...]:
    """The server-wide ``top_n``: each tenant's list holds all of its prefixes that can be
    among them, so merging the lists is exact."""
    entries = [entry for entries in by_tenant.values() for entry in entries]
    return tuple(heapq.nlargest(top_n, entries, key=lambda e: (e.hits, e.length)))


def _pin_entries(tree) -> list[PrefixEntry]:
    """Unexpired pins (the tree bounds them by the pin quotas, so there are few)."""
    now = tree.clock()
    live = [n for n in tree.pinned_nodes if n.pin is not None and n.pin.expiry > now]
    live.sort(key=lambda n: (n.ns.name, n.end))
    return [PrefixEntry(tenant=n.pin.owner or n.ns.tenant,
                        namespace=n.ns.name, length=n.end, hits=n.hits,
                        pin_ttl_s=n.pin.expiry - now, token_ids=tuple(n.path_tokens()))
            for n in live]
