"""Pin shares: how many tokens each tenant's breakpoints may keep pinned.

All pins together stay within the *pin ceiling*, ``pin_share`` of the KV budget. Each
tenant's *pin share* is min(its ``max_pinned_tokens``, ceiling / number of entries in
``tenant_quotas``): the shares add up to at most the ceiling, so a tenant within its own
share can always pin, whatever the others pinned (first come first served would let one
tenant take the whole ceiling). The gateway's quotas hold every configured tenant plus one
entry for the admin tenant, so each gets an equal part. Owners outside the quotas
(publishes into ``public``) get an equal part too; the admin's explicit pins
(``Engine.pin``) are the operator's and bypass shares, but every pin counts against the
ceiling. Engine thread only (reads the tree).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

from radixgate.kv import RadixTree

from .engine_config import EngineConfig

log = logging.getLogger(__name__)


def pin_ceiling(config: EngineConfig, num_blocks: int, block_size: int) -> int:
    return int(config.pin_share * num_blocks * block_size)


def pin_share(config: EngineConfig, ceiling: int, tenant: str) -> int:
    """Tokens ``tenant``'s breakpoints may keep pinned."""
    quotas = config.tenant_quotas
    parties = len(quotas) if isinstance(quotas, Mapping) and quotas else 1
    even = ceiling // parties
    quota = config.quota_for(tenant).max_pinned_tokens
    return even if quota is None else min(quota, even)


def pinned_prefix(tree: RadixTree, namespace: str, tokens, owner: str) -> int:
    """How much of ``tokens`` ``owner`` has pinned already in ``namespace``: the end of the
    deepest node on their cached path that lies on one of owner's pinned paths (those are
    prefix-closed), capped at len(tokens). A new pin of ``tokens`` adds the rest."""
    return tree.pinned_prefix(namespace, tokens, owner)


def log_pin_shares(config: EngineConfig, ceiling: int) -> None:
    """One log line: the ceiling and each configured tenant's share."""
    quotas = config.tenant_quotas
    tenants = sorted(quotas) if isinstance(quotas, Mapping) else []
    shares = ", ".join(f"{t}={pin_share(config, ceiling, t)}" for t in tenants)
    log.info("pins: ceiling %d tokens (pin_share %.2f of the KV cache); pin share per tenant: "
             "%s", ceiling, config.pin_share,
             shares or f"every tenant {pin_share(config, ceiling, '')}")
