"""Tenant quotas for a whole deployment, enforced once, in the gateway.

One engine enforces ``max_running`` (more wait), ``max_queued`` (beyond, 429) and the
server's ``max_queue`` (beyond, 503/529) itself; N replicas would enforce each N times
over. ``TenantAdmission`` applies the same quotas (``EngineConfig.quota_for``) before a
request is sent to any replica: a tenant at ``max_running`` waits here, in arrival order,
and its waiting requests count against ``max_queued`` and ``max_queue``.
"""
from __future__ import annotations

import asyncio
from collections import deque

from radixgate.runtime.api import ErrorKind, Request


class TenantAdmission:
    def __init__(self, config):
        self.config = config
        self.running: dict[str, int] = {}
        self.waiting: dict[str, deque[asyncio.Future]] = {}
        self.num_waiting = 0
        self.closed = False

    @property
    def in_flight(self) -> int:
        return sum(self.running.values())

    async def enter(self, request: Request) -> tuple[ErrorKind, str] | None:
        """Waits for a running slot of the request's tenant; the refusal, if any."""
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
                self.leave(request)  # handed over just as the waiter left
            else:
                queue.remove(slot)
                self.num_waiting -= 1
            raise
        return None

    def leave(self, request: Request) -> None:
        """The request ended: its slot goes to the tenant's next waiter, if any."""
        tenant = request.tenant
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
