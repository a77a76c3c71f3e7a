"""Batches on disk: each batch a folder of its own in the state folder (gateway/state_dir.py),
``batches/<tenant key>/<batch id>/``:

    meta.json       the batch: id, API, tenant, status, times, counts (replaced atomically)
    requests.jsonl  its requests as sent, one ``{"custom_id", "params"}`` a line
    results.jsonl   one result a line (``{"custom_id", "outcome", "body"}``: the API's own
                    result is ``body``), appended and fsynced as each request ends

A result on disk is never lost (``kill -9`` loses at most the requests running then, which
a restart runs again: ``pending`` is the requests without a result line). Without a state
folder the batches live in a temporary folder for the process's life. Folders are 0700,
files 0600. Bounded: ``MAX_OPEN_PER_TENANT`` unfinished batches a tenant, ``MAX_REQUESTS``
requests a batch, ``MAX_STORED_BYTES`` of batch files a tenant (ended batches count until
deleted or past ``RESULTS_KEPT_S``: then they are removed).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from radixgate.gateway.state_dir import private_folder, write_private
from radixgate.kv.tiers.disk.folders import PRIVATE_FILE

log = logging.getLogger("radixgate.gateway")
MAX_REQUESTS = 10_000
MAX_OPEN_PER_TENANT = 16
MAX_OPEN_REQUESTS_PER_TENANT = 100_000   # requests not yet done across a tenant's batches
MAX_STORED_BYTES = 2 << 30
COMPLETION_WINDOW_S = 86400.0          # unfinished requests expire a day after creation
RESULTS_KEPT_S = 29 * 86400.0          # as Anthropic: results kept 29 days after creation
OUTCOMES = ("succeeded", "errored", "canceled", "expired")


class QuotaExceeded(Exception):
    """A tenant's batch limits (the API answers 429)."""


@dataclass
class Batch:
    id: str
    api: str                   # "anthropic" | "openai"
    tenant: str
    created_at: float
    expires_at: float
    total: int
    status: str = "in_progress"          # in_progress | canceling | ended
    counts: dict = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    cancel_initiated_at: float | None = None
    ended_at: float | None = None
    extra: dict = field(default_factory=dict)   # the API's own fields (OpenAI: endpoint ...)

    @property
    def processing(self) -> int:
        return self.total - sum(self.counts.values())


def tenant_key(tenant: str) -> str:
    return hashlib.blake2b(tenant.encode(), digest_size=8).hexdigest()


class BatchStore:
    """Every tenant's batches (the event loop's only)."""

    def __init__(self, folder: Path | None, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.temporary = folder is None
        root = Path(tempfile.mkdtemp(prefix="radixgate-batches-")) if folder is None else folder
        self.root = private_folder(root, "batches")
        self.batches: dict[str, Batch] = {}
        self.done: dict[str, set[str]] = {}            # batch id -> custom ids with a result
        self._load()

    # -- creating -------------------------------------------------------------------------
    def create(self, api: str, tenant: str, lines: list[dict], extra: dict | None = None,
               prefix: str = "msgbatch_") -> Batch:
        now = self.clock()
        batch = Batch(prefix + secrets.token_hex(12), api, tenant, now,
                      now + COMPLETION_WINDOW_S, len(lines), extra=extra or {})
        folder = self._folder(batch)
        folder.mkdir(mode=0o700, parents=True)
        body = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
        write_private(folder / "requests.jsonl", body.encode())
        self.batches[batch.id] = batch
        self.done[batch.id] = set()
        self.save(batch)
        return batch

    def open_count(self, tenant: str) -> int:
        return sum(1 for b in self.batches.values() if b.tenant == tenant and b.status != "ended")

    def open_requests(self, tenant: str) -> int:
        return sum(b.processing for b in self.batches.values()
                   if b.tenant == tenant and b.status != "ended")

    def check_room(self, tenant: str, adding: int) -> None:
        """Raises ``QuotaExceeded`` when ``tenant`` may not open a batch of ``adding``
        requests now (open batches, open requests, stored bytes)."""
        if self.open_count(tenant) >= MAX_OPEN_PER_TENANT:
            raise QuotaExceeded(f"a tenant runs at most {MAX_OPEN_PER_TENANT} batches at once")
        if self.open_requests(tenant) + adding > MAX_OPEN_REQUESTS_PER_TENANT:
            raise QuotaExceeded(f"a tenant's unfinished batches hold at most "
                                f"{MAX_OPEN_REQUESTS_PER_TENANT} requests")
        if self.stored_bytes(tenant) > MAX_STORED_BYTES:
            raise QuotaExceeded("the tenant's stored batches are over their disk budget: "
                                "delete ended batches first")

    def stored_bytes(self, tenant: str) -> int:
        folder = self.root / tenant_key(tenant)
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) \
            if folder.exists() else 0

    # -- reading --------------------------------------------------------------------------
    def get(self, tenant: str, batch_id: str) -> Batch | None:
        batch = self.batches.get(batch_id)
        return batch if batch is not None and batch.tenant == tenant else None

    def list(self, tenant: str, api: str) -> list[Batch]:
        """The tenant's batches of ``api``, newest first."""
        return sorted((b for b in self.batches.values() if b.tenant == tenant and b.api == api),
                      key=lambda b: (-b.created_at, b.id))

    def requests(self, batch: Batch) -> Iterator[dict]:
        with open(self._folder(batch) / "requests.jsonl", encoding="utf-8") as lines:
            for line in lines:
                yield json.loads(line)

    def pending(self, batch: Batch) -> list[dict]:
        done = self.done[batch.id]
        return [r for r in self.requests(batch) if r["custom_id"] not in done]

    def results(self, batch: Batch) -> Iterator[dict]:
        """Each stored result: ``{"custom_id", "outcome", "body"}`` (a torn last line, from a
        crash while it was written, is skipped: its request runs again)."""
        path = self._folder(batch) / "results.jsonl"
        if not path.exists():
            return
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue

    # -- progress -------------------------------------------------------------------------
    def add_result(self, batch: Batch, custom_id: str, outcome: str, body: dict) -> None:
        """One request's result (``body``: in the API's own shape), on disk (fsynced)
        before it counts."""
        if custom_id in self.done[batch.id]:
            return
        line = json.dumps({"custom_id": custom_id, "outcome": outcome, "body": body},
                          ensure_ascii=False) + "\n"
        path = self._folder(batch) / "results.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.done[batch.id].add(custom_id)
        batch.counts[outcome] += 1
        self.save(batch)

    def end(self, batch: Batch) -> None:
        batch.status, batch.ended_at = "ended", self.clock()
        self.save(batch)

    def save(self, batch: Batch) -> None:
        write_private(self._folder(batch) / "meta.json", json.dumps(asdict(batch)).encode())

    def delete(self, batch: Batch) -> None:
        self.batches.pop(batch.id, None)
        self.done.pop(batch.id, None)
        shutil.rmtree(self._folder(batch), ignore_errors=True)

    def sweep(self) -> None:
        """Ended batches past ``RESULTS_KEPT_S`` are removed."""
        cutoff = self.clock() - RESULTS_KEPT_S
        for batch in [b for b in self.batches.values()
                      if b.status == "ended" and b.created_at < cutoff]:
            self.delete(batch)

    def _folder(self, batch: Batch) -> Path:
        return self.root / tenant_key(batch.tenant) / batch.id

    def _load(self) -> None:
        for meta in self.root.glob("*/*/meta.json"):
            try:
                batch = Batch(**json.loads(meta.read_text()))
                results = list(self.results(batch))
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.warning("batches: skipped unreadable %s (%s)", meta.parent, exc)
                continue
            batch.counts = dict.fromkeys(OUTCOMES, 0)      # recounted: the results are the truth
            for result in results:
                batch.counts[result["outcome"]] += 1
            self.batches[batch.id] = batch
            self.done[batch.id] = {r["custom_id"] for r in results}
        self.sweep()
