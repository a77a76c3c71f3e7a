"""Tenant quotas for a whole deployment, enforced once, in the gateway.

One engine enforces ``max_running`` (more wait), ``max_queued`` (beyond, 429) and the
server's ``max_queue`` (beyond, 503/529) itself; N replicas would enforce each N times
over. ``TenantAdmission`` applies the same quotas (``EngineConfig.quota_for``) before a
request is sent to any replica: a tenant at ``max_running`` waits here, in arrival order,
and its waiting requests count against ``max_queued`` and ``max_queue``. Two more, counted
here for the whole deployment:

- ``max_namespaces`` (``NamespaceBook``): the tenant's namespaces in least recently used
  order over every request the gateway sent; beyond the cap, the least recently used idle
  one (no request of it in flight, no pin of it unexpired) is retired on every replica
  (``Engine.retire_namespace``: its unpinned content goes, as one engine's cap does).
- ``max_pinned_tokens`` (``PinBook``): a request's breakpoints are reserved before it is
  sent: kept only while the tenant's pinned tokens as the replicas last reported them, plus
  the reservations of pins not yet in a report, plus this one stay within the quota. A
  reservation holds until a replica's report covers the request (``pins_settled``), so a
  burst between two reports cannot overrun the quota.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from radixgate.runtime.engine.api import ErrorKind, Request

MEMORY_PIN_MAX_S = 3600.0     # a pin keeps its namespace busy at most this long (memory pins)
SETTLE_TIMEOUT_S = 30.0       # a reservation no report covered goes this long after its end
ABANDONED_S = 3600.0          # ... and one whose request never ended (never read) this long


class TenantAdmission:
    """``retire(namespace)``: called for each namespace the deployment-wide cap retires
    (``ClusterEngine.retire_namespace``: a command to every replica)."""

    def __init__(self, config, retire: Callable[[str], object] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.running: dict[str, int] = {}
        self.waiting: dict[str, deque[asyncio.Future]] = {}
        self.num_waiting = 0
        self.closed = False
        self.retire = retire
        self.namespaces = NamespaceBook(config, clock)
        self.pins = PinBook(config, clock)

    @property
    def in_flight(self) -> int:
        return sum(self.running.values())

    async def enter(self, request: Request) -> tuple[ErrorKind, str] | None:
        """Waits for a running slot of the request's tenant; the refusal, if any."""
        try:
            refusal = await self._admit(request)
        except asyncio.CancelledError:
            self.pins.drop(request)           # it reaches no replica: it pins nothing
            raise
        if refusal is not None:
            self.pins.drop(request)
            return refusal
        for namespace in self.namespaces.open(request):
            if self.retire is not None:
                self.retire(namespace)
        return None

    async def _admit(self, request: Request) -> tuple[ErrorKind, str] | None:
        if self.closed:
            return ErrorKind.OVERLOADED, "the server is shutting down and admits no new requests"
        tenant = request.tenant
        quota = self.config.quota_for(tenant)
        if quota.max_running is None or self.running.get(tenant, 0) < quota.max_running:
            self.running[tenant] = self.running.get(tenant, 0) + 1
            return None
        if self.num_waiting >= self.config.max_queue:
            return ErrorKind.OVERLOADED, f"the waiting queue is full ({self.config.max_queue} requests)"
        queue = self.waiting.setdefault(tenant, deque())
        if quota.max_queued is not None and len(queue) >= quota.max_queued:
            return (ErrorKind.OVER_CAPACITY, f"tenant {tenant!r} already has {len(queue)} "
                    f"requests waiting (its limit is {quota.max_queued})")
        slot = asyncio.get_running_loop().create_future()
        queue.append(slot)
        self.num_waiting += 1
        try:
            await slot               # leave() hands its slot over: running stays counted
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():
                self._release_slot(tenant)   # handed over just as the waiter left
            else:
                queue.remove(slot)
                self.num_waiting -= 1
            raise
        return None

    def leave(self, request: Request) -> None:
        """The request ended: its slot goes to the tenant's next waiter, if any."""
        self.namespaces.close(request)
        self.pins.ended(request)
        self._release_slot(request.tenant)

    def _release_slot(self, tenant: str) -> None:
        queue = self.waiting.get(tenant)
        while queue:
            slot = queue.popleft()
            self.num_waiting -= 1
            if not slot.done():
                slot.set_result(None)
                return
        self.running[tenant] -= 1
        if not self.running[tenant]:
            del self.running[tenant]

    def close(self) -> None:
        self.closed = True


class NamespaceBook:
    """Each capped tenant's namespaces, least recently used first, over the deployment."""

    def __init__(self, config, clock: Callable[[], float] = time.monotonic):
        self.config, self.clock = config, clock
        self.by_tenant: dict[str, OrderedDict[str, list]] = {}   # name -> [users, pinned_until]

    def open(self, request: Request) -> list[str]:
        """``request`` is sent now: its namespace becomes the tenant's most recent; returns
        the idle namespaces to retire to bring the tenant back within its cap (it may stay
        above it while more of its namespaces are busy, as one engine's cap does)."""
        cap = self.config.quota_for(request.tenant).max_namespaces
        if cap is None:
            return []
        book = self.by_tenant.setdefault(request.tenant, OrderedDict())
        entry = book.pop(request.namespace, None) or [0, 0.0]
        entry[0] += 1
        book[request.namespace] = entry
        now, retired = self.clock(), []
        excess = len(book) - cap
        for name, (users, pinned_until) in list(book.items()):
            if excess <= 0:
                break
            if users or pinned_until > now:
                continue
            del book[name]
            retired.append(name)
            excess -= 1
        return retired

    def close(self, request: Request) -> None:
        """``request`` ended: its namespace is idle once no other request of it runs, and
        stays busy while the pins its breakpoints asked for last."""
        book = self.by_tenant.get(request.tenant)
        entry = book.get(request.namespace) if book is not None else None
        if entry is None:
            return
        entry[0] = max(0, entry[0] - 1)
        if request.breakpoints:
            ttl = min(MEMORY_PIN_MAX_S, max(p.ttl_s for p in request.breakpoints))
            entry[1] = max(entry[1], self.clock() + ttl)

    def count(self, tenant: str) -> int:
        return len(self.by_tenant.get(tenant, ()))


@dataclasses.dataclass
class _Reservation:
    tenant: str
    tokens: int
    made: float
    ended: float | None = None        # when the request ended at the gateway


class PinBook:
    """Tokens reserved for the breakpoints of requests the replicas' reports do not cover
    yet (``reserved_tokens``); see the module docstring."""

    def __init__(self, config, clock: Callable[[], float] = time.monotonic):
        self.config, self.clock = config, clock
        self.reservations: dict[str, _Reservation] = {}      # request id -> reservation

    def admit(self, request: Request, reports: Iterable[dict]) -> Request:
        """``request`` with the breakpoints that fit the tenant's ``max_pinned_tokens``
        (deepest last: a pin of a prefix adds at most its length), reserved; ``reports``:
        the replicas' routing stats (``pinned_tokens`` per tenant, ``pins_settled``)."""
        if not request.breakpoints:
            return request
        reports = list(reports)
        self.settle(reports)
        quota = self.config.quota_for(request.tenant).max_pinned_tokens
        if quota is None:
            return request
        held = sum(r.get("pinned_tokens", {}).get(request.tenant, 0) for r in reports)
        room = quota - held - self.reserved_tokens(request.tenant)
        kept = tuple(p for p in request.breakpoints if p.offset <= room)
        if kept:
            self.reservations[request.request_id] = _Reservation(
                request.tenant, max(p.offset for p in kept), self.clock())
        if len(kept) == len(request.breakpoints):
            return request
        return dataclasses.replace(request, breakpoints=kept)

    def drop(self, request: Request) -> None:
        """``request`` never reached a replica: its reservation goes now."""
        self.reservations.pop(request.request_id, None)

    def ended(self, request: Request) -> None:
        reservation = self.reservations.get(request.request_id)
        if reservation is not None and reservation.ended is None:
            reservation.ended = self.clock()

    def settle(self, reports: Iterable[dict]) -> None:
        """Drops the reservations a report covers (the pinned counts include them now) and
        those of requests that ended ``SETTLE_TIMEOUT_S`` ago without one (their replica
        left, or never pinned) and of requests never read (``ABANDONED_S``)."""
        for report in reports:
            for request_id in report.get("pins_settled", ()):
                self.reservations.pop(request_id, None)
        now = self.clock()
        for request_id, r in list(self.reservations.items()):
            if (r.ended is not None and r.ended < now - SETTLE_TIMEOUT_S
                    or r.made < now - ABANDONED_S):
                del self.reservations[request_id]

    def reserved_tokens(self, tenant: str) -> int:
        return sum(r.tokens for r in self.reservations.values() if r.tenant == tenant)
