"""radixgate.radix_cache: block pool and radix tree of token prefixes (pure Python, no torch).

See docs/ARCHITECTURE.md section 3 for the reference, lock and copy-on-write rules.
"""

from .cache_config import CacheConfig, CreditParams, make_policy
from .events import CacheEvent
from .integrity import IntegrityError
from .node import LockHandle, token_array
from .policy import CreditPolicy, EvictionPolicy, LRUPolicy
from .pool import BlockPool, BlockPoolError, OutOfBlocks
from .results import InsertResult, MatchResult, NamespaceStats, PrefixInfo, Probe, TreeStats
from .tree import RadixTree
from .window_slots import WindowSlots

# The namespace of published prefixes (``Engine.publish``), which tenants that opt in also
# match against; no tenant may take its name.
PUBLIC_NAMESPACE = "public"

__all__ = [
    "BlockPool", "BlockPoolError", "CacheConfig", "CacheEvent", "CreditParams", "CreditPolicy",
    "EvictionPolicy", "InsertResult", "IntegrityError", "LockHandle", "LRUPolicy", "MatchResult",
    "NamespaceStats", "OutOfBlocks", "PrefixInfo", "Probe", "PUBLIC_NAMESPACE", "RadixTree",
    "TreeStats", "WindowSlots", "make_policy", "token_array",
]
