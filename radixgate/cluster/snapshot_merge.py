"""One ``EngineSnapshot`` for a deployment: the replicas' snapshots summed, each listed.

Counts (blocks, tree, requests, tenants, evictions, tokens reused per tier, steps...) add
up; the top prefixes are merged by hits; ``replicas`` lists each replica
(``runtime.engine.snapshot.ReplicaCounts``). The replicas' disk tiers (each its own subfolder with
its part of the budget) are summed into one ``tier``: budgets, blocks, bytes, loads,
writes and drops add up, ``full`` when any replica's disk is full, ``folder`` the
deployment's (the replicas' parent folder).
"""
from __future__ import annotations

import heapq
import os
import time
from collections.abc import Mapping
from types import MappingProxyType

from radixgate.kv.tiers.disk import TierStats
from radixgate.runtime.engine.snapshot import (BlockCounts, EngineSnapshot, ReplicaCounts,
                                               TenantCounts, TreeCounts, empty_snapshot)

TOP_N = 10


def merge_snapshots(snapshots: Mapping[str, EngineSnapshot], hit_rates: Mapping[str, float],
                    views: Mapping[str, dict], block_size: int) -> EngineSnapshot:
    """``snapshots``: replica -> its latest snapshot; ``hit_rates`` and ``views`` (the
    router's in_flight / indexed_blocks, and ``stale``) per replica."""
    if not snapshots:
        return empty_snapshot(0, block_size)
    snaps = list(snapshots.values())
    first = snaps[0]
    return EngineSnapshot(
        time=time.monotonic(), block_size=first.block_size,
        blocks=BlockCounts(*(sum(getattr(s.blocks, f) for s in snaps)
                             for f in ("total", "free", "cached", "pinned", "in_use"))),
        tree=TreeCounts(*(sum(getattr(s.tree, f) for s in snaps)
                          for f in ("nodes", "cached_tokens", "evictable_tokens",
                                    "pinned_tokens", "namespaces"))),
        running=sum(s.running for s in snaps), waiting=sum(s.waiting for s in snaps),
        tenants=MappingProxyType(_tenants(snaps)),
        evictions=MappingProxyType(_summed(s.evictions for s in snaps)),
        top_prefixes=_top(e for s in snaps for e in s.top_prefixes),
        prefill_tokens_per_s=sum(s.prefill_tokens_per_s for s in snaps),
        steps=sum(s.steps for s in snaps), finished=sum(s.finished for s in snaps),
        errors=sum(s.errors for s in snaps), draining=any(s.draining for s in snaps),
        preemptions=sum(s.preemptions for s in snaps),
        step_time_s=sum(s.step_time_s for s in snaps),
        forward_time_s=sum(s.forward_time_s for s in snaps),
        pins=tuple(p for s in snaps for p in s.pins),
        tenant_prefixes=MappingProxyType(_tenant_prefixes(snaps)),
        kv_dtype=first.kv_dtype, kv_bytes_per_token=first.kv_bytes_per_token,
        hit_tokens=MappingProxyType(_summed(s.hit_tokens for s in snaps)),
        spec=MappingProxyType(_summed(s.spec for s in snaps)),
        tier=merge_tiers([s.tier for s in snaps if s.tier is not None]),
        kv_bytes=sum(s.kv_bytes for s in snaps),
        window_pool=merge_window_pools([s.window_pool for s in snaps]),
        replicas=tuple(ReplicaCounts(name, s.blocks, round(hit_rates.get(name, 0.0), 6),
                                     s.running, s.waiting,
                                     views.get(name, {}).get("in_flight", 0),
                                     views.get(name, {}).get("indexed_blocks", 0),
                                     views.get(name, {}).get("stale", False))
                       for name, s in sorted(snapshots.items())))


WINDOW_COUNTS = ("blocks", "free", "cached", "in_use", "tombstoned")


def merge_window_pools(pools) -> Mapping | None:
    """The replicas' window pools (one model: the same layers and window), counts summed."""
    pools = [p for p in pools if p is not None]
    if not pools:
        return None
    merged = dict(pools[0])
    merged.update({k: sum(p[k] for p in pools) for k in WINDOW_COUNTS})
    return MappingProxyType(merged)


def _tenants(snaps) -> dict[str, TenantCounts]:
    out: dict[str, TenantCounts] = {}
    for s in snaps:
        for tenant, c in s.tenants.items():
            o = out.get(tenant, TenantCounts())
            out[tenant] = TenantCounts(o.running + c.running, o.waiting + c.waiting,
                                       o.pinned_tokens + c.pinned_tokens)
    return dict(sorted(out.items()))


def _summed(mappings) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in mappings:
        for key, value in m.items():
            out[key] = out.get(key, 0) + value
    return out


def _top(entries):
    return tuple(heapq.nlargest(TOP_N, entries, key=lambda e: (e.hits, e.length)))


def _tenant_prefixes(snaps) -> dict:
    merged: dict[str, list] = {}
    for s in snaps:
        for tenant, entries in s.tenant_prefixes.items():
            merged.setdefault(tenant, []).extend(entries)
    return {tenant: _top(entries) for tenant, entries in merged.items()}


def merge_tiers(tiers: list[TierStats]) -> TierStats | None:
    """The replicas' disk tiers as one (None without any)."""
    if not tiers:
        return None
    summed = {name: sum(getattr(t, name) for t in tiers)
              for name in ("budget_bytes", "blocks", "bytes", "retained_blocks", "hit_tokens",
                           "loads", "loaded_blocks", "load_bytes", "load_s", "writes",
                           "write_bytes", "evicted", "staged_bytes")}
    folders = {os.path.dirname(t.folder.rstrip("/")) for t in tiers}
    return TierStats(kind=tiers[0].kind, folder=folders.pop() if len(folders) == 1 else "",
                     drops=MappingProxyType(_summed(t.drops for t in tiers)),
                     full=any(t.full for t in tiers), **summed)
