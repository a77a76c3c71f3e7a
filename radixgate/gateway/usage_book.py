"""Per-tenant usage the gateway records from each finished request.

The engine snapshot knows blocks, the tree and the queues; token counts, TTFT samples and
the per-second history come from the ``Usage`` of every request the gateway finishes, so
they can be split by tenant exactly. Only the event loop thread touches a ``UsageBook``.
Each request is also counted in the book's per-day ``ledger`` (radixgate/gateway/usage_history.py,
GET /v1/cache/usage), which outlives a restart when the server has a state folder.
"""
from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from radixgate.gateway.usage_history import UsageLedger, open_ledger
from radixgate.runtime.engine.api import Usage

HISTORY_SECONDS = 600
TTFT_SAMPLES = 2048
COUNTERS = ("prompt", "cache_read", "cache_creation", "cache_creation_5m", "cache_creation_1h",
            "cache_creation_24h", "uncached", "output", "finished", "errors")


@dataclass
class TenantUsage:
    prompt: int = 0
    cache_read: int = 0
    cache_creation: int = 0
    cache_creation_5m: int = 0       # the part of cache_creation pinned with a 5-minute TTL
    cache_creation_1h: int = 0       # ... and with a 1-hour TTL
    cache_creation_24h: int = 0      # ... and with a 24-hour TTL
    uncached: int = 0
    output: int = 0
    finished: int = 0
    errors: int = 0
    ttft_hit_ms: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=TTFT_SAMPLES))
    ttft_miss_ms: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=TTFT_SAMPLES))
    # second (int, since book start) -> [prompt, cache_read]; at most HISTORY_SECONDS entries
    history: collections.OrderedDict = field(default_factory=collections.OrderedDict)

    def tokens(self) -> dict[str, int]:
        return {"prompt": self.prompt, "cache_read": self.cache_read,
                "cache_creation": self.cache_creation,
                "cache_creation_5m": self.cache_creation_5m,
                "cache_creation_1h": self.cache_creation_1h,
                "cache_creation_24h": self.cache_creation_24h,
                "uncached": self.uncached, "output": self.output}

    @property
    def hit_rate(self) -> float:
        return self.cache_read / self.prompt if self.prompt else 0.0


class UsageBook:
    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 ledger: UsageLedger | None = None):
        """``clock`` times the per-second history; ``ledger`` (default: one in memory only)
        gets every request too, per day."""
        self._clock = clock
        self.started = clock()
        self.tenants: dict[str, TenantUsage] = {}
        self.ledger = ledger if ledger is not None else UsageLedger(None)

    @classmethod
    def for_config(cls, config) -> UsageBook:
        """The server's book: its ledger kept in the state folder of ``config`` (a
        ``GatewayConfig``), loaded now; in memory only when there is no state folder."""
        return cls(ledger=open_ledger(config))

    def record(self, tenant: str, usage: Usage, ok: bool) -> None:
        """Count one finished request. A failed one (``ok`` False) counts as an error and its
        tokens are not counted (most never ran: refused at admission)."""
        self.ledger.record(tenant, usage, ok)
        book = self.tenants.setdefault(tenant, TenantUsage())
        if not ok:
            book.errors += 1
            return
        book.prompt += usage.prompt_tokens
        book.cache_read += usage.cache_read_tokens
        book.cache_creation += usage.cache_creation_tokens
        book.cache_creation_5m += usage.cache_creation_5m_tokens
        book.cache_creation_1h += usage.cache_creation_1h_tokens
        book.cache_creation_24h += usage.cache_creation_24h_tokens
        book.uncached += usage.uncached_tokens
        book.output += usage.output_tokens
        book.finished += 1
        if usage.ttft_s is not None:
            samples = book.ttft_hit_ms if usage.cache_read_tokens > 0 else book.ttft_miss_ms
            samples.append(usage.ttft_s * 1000.0)
        self._add_history(book, usage.prompt_tokens, usage.cache_read_tokens)

    def record_rejected(self, tenant: str) -> None:
        """A request refused before it reached the engine (quota, rate, validation)."""
        self.ledger.record(tenant, None, ok=False)
        self.tenants.setdefault(tenant, TenantUsage()).errors += 1

    def flush(self) -> None:
        """Writes the per-day ledger now (at shutdown; a no-op without a state folder)."""
        self.ledger.flush()

    def _add_history(self, book: TenantUsage, prompt: int, cache_read: int) -> None:
        second = int(self._clock() - self.started)
        sample = book.history.get(second)
        if sample is None:
            sample = book.history[second] = [0, 0]
        sample[0] += prompt
        sample[1] += cache_read
        while book.history and next(iter(book.history)) <= second - HISTORY_SECONDS:
            book.history.popitem(last=False)

    def uptime_s(self) -> float:
        return self._clock() - self.started

    def selected(self, tenant: str | None) -> list[TenantUsage]:
        """All tenants' books (``None``) or just one (possibly empty)."""
        if tenant is None:
            return list(self.tenants.values())
        return [self.tenants[tenant]] if tenant in self.tenants else []

    def totals(self, tenant: str | None) -> TenantUsage:
        total = TenantUsage()
        for book in self.selected(tenant):
            for name in COUNTERS:
                setattr(total, name, getattr(total, name) + getattr(book, name))
            total.ttft_hit_ms.extend(book.ttft_hit_ms)
            total.ttft_miss_ms.extend(book.ttft_miss_ms)
        return total

    def history(self, tenant: str | None) -> list[dict]:
        """Per-second samples over the last HISTORY_SECONDS: {t, prompt, cache_read}."""
        merged: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
        horizon = int(self.uptime_s()) - HISTORY_SECONDS
        for book in self.selected(tenant):
            for second, (prompt, read) in book.history.items():
                if second > horizon:
                    merged[second][0] += prompt
                    merged[second][1] += read
        return [{"t": s, "prompt": p, "cache_read": r} for s, (p, r) in sorted(merged.items())]


def percentile(samples: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None without samples."""
    ordered = sorted(samples)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return round(ordered[rank - 1], 3)
