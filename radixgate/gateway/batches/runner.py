"""The batch runner: one asyncio task per gateway that runs every tenant's batch requests
below interactive traffic (each engine request has ``priority = BATCH_PRIORITY``: the
scheduler admits it only while no interactive request waits for room, prefills it after
them and preempts it first).

Order: each tenant's pending requests are sorted by their prompt (the API's ``group_key``:
system, tools, then the messages, as text), so requests sharing a prefix run one after
another: the prefix is computed once and read while it is cached (SGLang's longest-prefix
grouping), whatever order the batch listed them in. Tenants take turns. At most
``IN_FLIGHT`` requests run at once. Cancelling drops a batch's requests that have not
started (``canceled`` results); a batch past its window gets ``expired`` results for the
rest. A restart resumes every unfinished batch from its stored results
(``BatchStore.pending``).
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from dataclasses import dataclass
from typing import Awaitable, Callable

from radixgate.gateway.batches.store import Batch, BatchStore

log = logging.getLogger("radixgate.gateway")
IN_FLIGHT = 8
SWEEP_S = 30.0


@dataclass(frozen=True)
class BatchApi:
    """One API's batch work: how to run a request line, what its cancelled / expired
    results look like, and the text its requests are grouped by."""

    execute: Callable[[Batch, dict], Awaitable[tuple[str, dict]]]   # -> (outcome, body)
    ended: Callable[[str, dict], dict]        # (outcome canceled|expired, line) -> body
    group_key: Callable[[dict], str]


class BatchRunner:
    def __init__(self, store: BatchStore, apis: dict[str, BatchApi],
                 ready: Callable[[], bool]):
        self.store, self.apis, self.ready = store, apis, ready
        self.queues: dict[str, deque] = {}        # tenant -> (batch id, line), grouped
        self.running: dict[asyncio.Task, tuple[str, str]] = {}   # task -> (batch, custom id)
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        for batch in self.store.batches.values():
            if batch.status != "ended":
                self.add(batch)
        self.task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        for task in list(self.running):
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)

    # -- batches --------------------------------------------------------------------------
    def add(self, batch: Batch) -> None:
        """Queue ``batch``'s pending requests among its tenant's, grouped by prompt."""
        api = self.apis[batch.api]
        queue = self.queues.setdefault(batch.tenant, deque())
        items = list(queue) + [(batch.id, line) for line in self.store.pending(batch)]
        items.sort(key=lambda item: api_key(self.apis, self.store, item))
        self.queues[batch.tenant] = deque(items)
        self.wake.set()

    def cancel(self, batch: Batch) -> None:
        batch.status = "canceling"
        batch.cancel_initiated_at = self.store.clock()
        self._drop(batch, "canceled")

    def _drop(self, batch: Batch, outcome: str) -> None:
        """``batch``'s requests not started yet end with ``outcome``."""
        queue = self.queues.get(batch.tenant, deque())
        mine = [item for item in queue if item[0] == batch.id]
        self.queues[batch.tenant] = deque(item for item in queue if item[0] != batch.id)
        api = self.apis[batch.api]
        for _, line in mine:
            self.store.add_result(batch, line["custom_id"], outcome, api.ended(outcome, line))
        self._maybe_end(batch)

    def _maybe_end(self, batch: Batch) -> None:
        if batch.processing == 0 and batch.status != "ended":
            self.store.end(batch)

    # -- the loop -------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            self._expire()
            while self.ready() and len(self.running) < IN_FLIGHT:
                item = self._next()
                if item is None:
                    break
                self._launch(*item)
            self.wake.clear()
            waits = [asyncio.ensure_future(self.wake.wait())] + list(self.running)
            done, _ = await asyncio.wait(waits, timeout=SWEEP_S if self.ready() else 0.2,
                                         return_when=asyncio.FIRST_COMPLETED)
            waits[0].cancel()

    def _next(self) -> tuple[Batch, dict] | None:
        """The next request: tenants in turn, each tenant's queue in group order."""
        for tenant in list(self.queues):
            queue = self.queues[tenant]
            while queue:
                batch_id, line = queue.popleft()
                batch = self.store.batches.get(batch_id)
                if batch is not None and batch.status == "in_progress":
                    self.queues[tenant] = self.queues.pop(tenant)   # this tenant goes last
                    return batch, line
            del self.queues[tenant]
        return None

    def _launch(self, batch: Batch, line: dict) -> None:
        task = asyncio.get_running_loop().create_task(self._one(batch, line))
        self.running[task] = (batch.id, line["custom_id"])
        task.add_done_callback(self._finished)

    async def _one(self, batch: Batch, line: dict) -> None:
        try:
            outcome, body = await self.apis[batch.api].execute(batch, line)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - one request's failure is its own result
            log.exception("batch %s: request %s failed", batch.id, line.get("custom_id"))
            outcome, body = "errored", self.apis[batch.api].ended("errored", line)
        if batch.id in self.store.batches:
            self.store.add_result(batch, line["custom_id"], outcome, body)
            self._maybe_end(batch)

    def _finished(self, task: asyncio.Task) -> None:
        self.running.pop(task, None)
        self.wake.set()

    def _expire(self) -> None:
        now = self.store.clock()
        for batch in list(self.store.batches.values()):
            if batch.status == "in_progress" and batch.expires_at <= now:
                self._drop(batch, "expired")
            elif batch.status == "canceling":
                self._maybe_end(batch)
        self.store.sweep()


def prompt_key(line: dict, fields: tuple[str, ...]) -> str:
    """The text a request line's ``params`` fields (tools, system, messages, prompt) make:
    requests sharing them sort next to each other."""
    params = line.get("params") or {}
    if not isinstance(params, dict):
        return ""
    return json.dumps([params.get(f) for f in fields], sort_keys=True, ensure_ascii=False)


def api_key(apis: dict[str, BatchApi], store: BatchStore, item: tuple[str, dict]) -> str:
    batch = store.batches.get(item[0])
    return apis[batch.api].group_key(item[1]) if batch is not None else ""
