"""The cache's configuration: one frozen value, parsed once (the gateway's ``[cache]``
section with its ``[cache.credit]`` and ``[cache.disk]`` tables, or the CLI flags) and
handed down to the engine, the tree and the disk tier.

``make_policy(config)`` turns it into the eviction policy the tree runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .dtypes import KV_DTYPES
from .core.policy import CreditPolicy, EvictionPolicy, LRUPolicy

POLICIES = ("lru", "credit")


@dataclass(frozen=True, slots=True)
class CreditParams:
    """Parameters of the ``credit`` policy (LRU with credits and a penalty; see
    ``radixgate/kv/core/policy/credit.py`` for what each one does)."""

    continuation_ticks: int = 200
    branch_ticks: int = 64
    partial_tails_first: bool = True
    branch_cap: int = 4
    probation_ticks: int = 1000
    probation_branches: int = 4

    def __post_init__(self) -> None:
        if min(self.continuation_ticks, self.branch_ticks, self.probation_ticks) < 0:
            raise ValueError("cache.credit continuation_ticks, branch_ticks and probation_ticks "
                             "must be >= 0 (0: none)")
        if self.branch_cap < 1 or self.probation_branches < 2:
            raise ValueError("cache.credit branch_cap must be >= 1 and probation_branches >= 2")


@dataclass(frozen=True, slots=True)
class DiskTierConfig:
    """The disk tier below memory (``[cache.disk]``; radixgate/kv/tiers/disk/): blocks evicted
    from memory are written to the folder ``dir`` within ``gb`` GiB and come back on a hit.
    Both set (the tier is on), or neither (off)."""

    dir: str = ""
    gb: float = 0.0

    def __post_init__(self) -> None:
        if not self.gb >= 0:
            raise ValueError(f"cache.disk gb must be >= 0 (0: no disk tier), got {self.gb}")
        if bool(self.dir) != (self.gb > 0):
            raise ValueError("cache.disk dir and gb go together: a folder and a budget > 0 "
                             f"for the disk tier (got {self.dir!r}, {self.gb})")

    @property
    def enabled(self) -> bool:
        return bool(self.dir)

    @property
    def budget_bytes(self) -> int:
        return int(self.gb * (1 << 30))

    def for_replica(self, index: int, count: int) -> "DiskTierConfig":
        """Replica ``index``'s part of a deployment of ``count``: its own subfolder
        ``dir/replica-<index>`` (one server per folder) and ``gb / count`` (the replicas
        together stay within ``gb``). Off stays off."""
        if not self.dir:
            return self
        return DiskTierConfig(replica_disk_dir(self.dir, index), self.gb / count)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Everything that shapes the KV cache.

    kv_cache_gb: the KV budget; block_size: tokens per KV block; policy: ``"lru"`` or
    ``"credit"`` (with ``credit``'s parameters); kv_dtype: the KV element type (``"auto"``:
    the model's dtype; ``int8`` / ``fp8`` keep a float16 scale per token and kv head:
    radixgate/runtime/model/kv_cache.py); disk: the disk tier below memory
    (``DiskTierConfig``; it needs the prefix cache, whole-token matching included);
    enable_prefix_cache / page_rounded_match: the baselines of the benchmarks (no reuse;
    reuse rounded down to whole blocks). window_ratio: for models with sliding-window
    layers, window-pool blocks per main block (0: auto, ``2 (W + step) / context``; 1: one
    pool, the window layers counted in full; radixgate/kv/groups/window_plan.py).
    """

    kv_cache_gb: float = 4.0
    block_size: int = 16
    policy: str = "credit"
    credit: CreditParams = field(default_factory=CreditParams)
    kv_dtype: str = "auto"
    disk: DiskTierConfig = field(default_factory=DiskTierConfig)
    enable_prefix_cache: bool = True
    page_rounded_match: bool = False
    window_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"cache.policy must be one of {POLICIES}, got {self.policy!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"cache.kv_dtype must be one of {KV_DTYPES}, got {self.kv_dtype!r}")
        if self.block_size < 1 or self.kv_cache_gb <= 0:
            raise ValueError("cache.block_size >= 1 and kv_cache_gb > 0 required")
        if not 0.0 <= self.window_ratio <= 1.0:
            raise ValueError(f"cache.window_ratio must lie in [0, 1] (0: auto), "
                             f"got {self.window_ratio}")
        if self.disk.enabled and (not self.enable_prefix_cache or self.page_rounded_match):
            raise ValueError("the disk tier (cache.disk dir) needs the prefix cache with "
                             "token-exact matching (enable_prefix_cache on, "
                             "page_rounded_match off)")

    @property
    def kv_cache_bytes(self) -> int:
        return int(self.kv_cache_gb * (1 << 30))

    def for_replica(self, index: int, count: int) -> "CacheConfig":
        """This config for replica ``index`` of a deployment of at most ``count``: its disk
        tier's part (``DiskTierConfig.for_replica``)."""
        if not 0 <= index < count:
            raise ValueError(f"replica index {index} outside the deployment's {count}")
        if not self.disk.enabled:
            return self
        return replace(self, disk=self.disk.for_replica(index, count))


REPLICA_FOLDER_PREFIX = "replica-"


def replica_disk_dir(folder: str, index: int) -> str:
    """The disk tier folder of replica ``index`` inside a deployment's tier folder."""
    return f"{folder.rstrip('/')}/{REPLICA_FOLDER_PREFIX}{index}"


def make_policy(config: CacheConfig) -> EvictionPolicy:
    """A new eviction policy of the kind ``config`` names, for one
    ``RadixTree(pool, policy=...)`` (a policy keeps one tree's state: make one per tree)."""
    if config.policy == "lru":
        return LRUPolicy()
    return CreditPolicy(config.credit)
