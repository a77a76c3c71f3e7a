"""The engine's side of the disk tier: built from ``[cache.disk]`` ``dir`` / ``gb``. What
feeds it (the tree's evictions, long pins, the whole tree at shutdown) speaks to any lower
tier: kv/tiers/base.py (re-exported here for the tier's callers)."""
from __future__ import annotations

import logging
from collections.abc import Callable

from radixgate.plural import plural

from ..base import block_tiers, close_tier, spill_to, tree_nodes, write_through
from . import open_disk_tier
from .tier import KVTier

log = logging.getLogger(__name__)


def open_tier(config, kv, fingerprint, description: str,
              wake: Callable[[], None] | None = None) -> KVTier | None:
    """The disk tier ``config.cache`` asks for (None without ``disk.dir``); the tree built
    after it takes ``spill_to(tier)`` (tiers/base.py) as its eviction hook. ``fingerprint()``
    gives the model's 16 bytes (called only when a tier opens: it reads the weights);
    ``wake`` is called on the tier's reader thread when a load finished."""
    cache = config.cache
    if not cache.disk.enabled:
        return None
    tier = open_disk_tier(cache, kv, fingerprint(), description=description, wake=wake)
    log.info("KV disk tier at %s: %.2f GiB budget, %s held", cache.disk.dir,
             cache.disk.gb, plural(tier.stats().blocks, "block"))
    return tier


__all__ = ["block_tiers", "close_tier", "open_tier", "spill_to", "tree_nodes", "write_through"]
