"""Eviction policies: which unlocked leaf the tree gives up first.

The tree tells its policy about every node it creates, touches, splits, trims or removes
and offers it leaves that may be evictable; the policy keeps its own per-node record
(``node.policy_state``) and its queues, and names victims when the tree must free blocks.
``LRUPolicy`` is plain least-recently-used; ``CreditPolicy`` adds credits for expected
continuations and branching prefixes, probation for one-off content and gives back partly
filled last blocks first. ``config.make_policy`` picks one from a ``CacheConfig``.
"""

from .base import EvictionPolicy
from .credit import CreditPolicy
from .lru import LRUPolicy

__all__ = ["CreditPolicy", "EvictionPolicy", "LRUPolicy"]
