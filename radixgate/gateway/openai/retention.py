"""OpenAI's ``prompt_cache_retention`` on every OpenAI route (chat completions, completions,
Responses): ``"24h"`` pins the whole prompt; ``"in_memory"`` (OpenAI's default) pins nothing.

With a disk tier the pin lasts a day there (memory keeps it at most an hour:
``radixgate.kv.manager.MEMORY_PIN_MAX_TTL_S``; a pin of an hour or more is written to the tier at
once, so it survives a restart); without one it is a 1-hour pin in memory. The tokens it
pins count as cache creation (``cache_creation_24h_tokens`` in the engine's ``Usage``, or
1h without a tier) and the usage reports them (``prompt_tokens_details.
cache_creation_tokens``); the response names the retention it was given.
"""
from __future__ import annotations

RETENTION_PIN_TTL_S = 3600.0       # "24h" without a disk tier: a 1 h pin in memory
DISK_RETENTION_TTL_S = 86400.0     # with one: kept 24 h on disk (memory keeps pins <= 1 h)


def retention_pin_s(state, retention: str | None) -> float | None:
    """How long the whole prompt is pinned for ``retention`` (None: not pinned)."""
    if retention != "24h":
        return None
    return DISK_RETENTION_TTL_S if state.config.cache.disk.enabled else RETENTION_PIN_TTL_S
