"""radixgate.kv: block pool and radix tree of token prefixes (pure Python, no torch).

See docs/ARCHITECTURE.md section 3 for the reference, lock and copy-on-write rules.
"""

from .config import CacheConfig, CreditParams, DiskTierConfig, make_policy
from .core.events import CacheEvent
from .core.integrity import IntegrityError
from .core.node import LockHandle, token_array
from .core.policy import CreditPolicy, EvictionPolicy, LRUPolicy
from .core.pool import BlockPool, BlockPoolError, OutOfBlocks
from .core.results import InsertResult, MatchResult, NamespaceStats, PrefixInfo, Probe, TreeStats
from .core.tree import RadixTree
from .groups.window_slots import WindowSlots

# The namespace of published prefixes (``Engine.publish``), which tenants that opt in also
# match against; no tenant may take its name.
PUBLIC_NAMESPACE = "public"

__all__ = [
    "BlockPool", "BlockPoolError", "CacheConfig", "CacheEvent", "CreditParams", "CreditPolicy",
    "DiskTierConfig", "EvictionPolicy", "InsertResult", "IntegrityError", "LockHandle",
    "LRUPolicy", "MatchResult", "NamespaceStats", "OutOfBlocks", "PrefixInfo", "Probe",
    "PUBLIC_NAMESPACE", "RadixTree", "TreeStats", "WindowSlots", "make_policy", "token_array",
]
