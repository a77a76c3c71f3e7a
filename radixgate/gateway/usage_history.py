"""Per-tenant cache usage per UTC day: the ledger behind GET /v1/cache/usage.

One row per (day, tenant) with the counters of ``FIELDS``: requests (every request the
usage book records: finished, failed, or refused by the rate limit), errors (those failed
or refused; their tokens are not counted), prompt, cache_read, cache_creation by TTL
(5m / 1h / 24h), uncached and output tokens. The injectable clock (``time.time``) decides
the day: a UTC day is ``int(now // 86400)`` (Unix time has no leap seconds), shown as
``YYYY-MM-DD``.

Bounded: at most ``max_days`` days, a window that ends today (older days go as the days
turn), and at most ``max_tenants`` tenants over the kept days; a new tenant beyond it drops
the oldest days first (a tenant with no traffic in the kept days disappears) and, when
only today is left, is not counted (logged once per day).

Persisted in the state folder as ``usage/ledger.json`` (folder 0700, file 0600, replaced
atomically: ``state_dir.write_private``), never on the request path: a change starts one
writer thread, which writes at once, then again at most every ``flush_interval_s`` while
there are changes, and ends when there are none; ``flush()`` writes what is left at
shutdown. A process killed outright loses at most the last ``flush_interval_s`` seconds.
A damaged or unreadable file is logged, kept beside as ``ledger.json.damaged``, and the
ledger starts empty; without a state folder it lives in memory only.

The event loop records; the writer thread and the shutdown flush read: ``_lock`` guards the
rows, ``_write_lock`` keeps one write at a time.
"""
from __future__ import annotations

import datetime
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Callable

from radixgate.gateway.state_dir import private_folder, state_folder, write_private
from radixgate.runtime.engine.api import Usage

log = logging.getLogger("radixgate.gateway")

FIELDS = ("requests", "errors", "prompt", "cache_read", "cache_creation_5m",
          "cache_creation_1h", "cache_creation_24h", "uncached", "output")
_TOKEN_FIELDS = (("prompt", "prompt_tokens"), ("cache_read", "cache_read_tokens"),
                 ("cache_creation_5m", "cache_creation_5m_tokens"),
                 ("cache_creation_1h", "cache_creation_1h_tokens"),
                 ("cache_creation_24h", "cache_creation_24h_tokens"),
                 ("uncached", "uncached_tokens"), ("output", "output_tokens"))
_TOKEN_SLOTS = tuple((FIELDS.index(name), attribute) for name, attribute in _TOKEN_FIELDS)
MAX_DAYS = 90
MAX_TENANTS = 1024
FLUSH_INTERVAL_S = 5.0
FILE_VERSION = 1
FOLDER_NAME = "usage"
FILE_NAME = "ledger.json"
MAX_FILE_BYTES = 256 << 20        # a bigger file is not one this ledger wrote: damaged
_DAY_S = 86400
_EPOCH = datetime.date(1970, 1, 1).toordinal()
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


class DamagedLedger(ValueError):
    """The ledger file is not one this module wrote."""


def parse_date(text: str) -> int:
    """A ``YYYY-MM-DD`` date as a day number (days since 1970-01-01); ValueError otherwise."""
    if not isinstance(text, str) or not _DATE.fullmatch(text):
        raise ValueError(f"{text!r} is not a date (YYYY-MM-DD)")
    return datetime.date.fromisoformat(text).toordinal() - _EPOCH


def format_day(day: int) -> str:
    return datetime.date.fromordinal(day + _EPOCH).isoformat()


def open_ledger(config) -> UsageLedger:
    """The ledger for a ``GatewayConfig``: in ``<state folder>/usage/ledger.json``, loaded
    now; in memory only when the server has no state folder or cannot make it (logged)."""
    try:
        folder = state_folder(config)
        path = None if folder is None else private_folder(folder, FOLDER_NAME) / FILE_NAME
    except OSError as e:
        log.error("usage ledger: the state folder cannot be used (%s); the per-day usage "
                  "history is kept in memory only", e)
        path = None
    return UsageLedger(path)


class UsageLedger:
    def __init__(self, path: Path | None = None, *, clock: Callable[[], float] = time.time,
                 max_days: int = MAX_DAYS, max_tenants: int = MAX_TENANTS,
                 flush_interval_s: float = FLUSH_INTERVAL_S):
        if max_days < 1 or max_tenants < 1:
            raise ValueError("max_days and max_tenants must be >= 1")
        self.path = path
        self.max_days, self.max_tenants = max_days, max_tenants
        self.flush_interval_s = flush_interval_s
        self.dropped = 0                  # requests not counted: the tenant bound was full
        self._clock = clock
        self._days: dict[int, dict[str, list[int]]] = {}   # day -> tenant -> FIELDS' counts
        self._tenant_days: dict[str, int] = {}             # tenant -> kept days it has a row in
        self._warned_day: int | None = None
        self._dirty = False
        self._failing = False             # the last write failed (logged once)
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        if path is not None:
            self._load()

    # -- recording (event loop) -----------------------------------------------------------
    def record(self, tenant: str, usage: Usage | None, ok: bool) -> None:
        """Count one request on today's row: its tokens when ``ok``, else an error (also for
        ``usage`` None: refused before the engine)."""
        day = int(self._clock() // _DAY_S)
        with self._lock:
            row = self._row(day, tenant)
            if row is None:
                return
            row[0] += 1
            if not ok or usage is None:
                row[1] += 1
            else:
                for slot, attribute in _TOKEN_SLOTS:
                    row[slot] += getattr(usage, attribute)
            self._changed()

    def _row(self, day: int, tenant: str) -> list[int] | None:
        """The (day, tenant) row, made if need be within the bounds; None when it may not be."""
        rows = self._days.get(day)
        if rows is None:
            rows = self._days[day] = {}
            self._trim(day)
            if day not in self._days:       # older than the window (a clock gone back)
                return None
        row = rows.get(tenant)
        if row is None:
            if tenant not in self._tenant_days and not self._room_for_tenant(day):
                return None
            row = rows[tenant] = [0] * len(FIELDS)
            self._tenant_days[tenant] = self._tenant_days.get(tenant, 0) + 1
        return row

    def _room_for_tenant(self, day: int) -> bool:
        """Drops the oldest days before ``day`` until one more tenant fits; False if none do."""
        while len(self._tenant_days) >= self.max_tenants:
            oldest = min(self._days)
            if oldest >= day:
                self.dropped += 1
                if self._warned_day != day:
                    self._warned_day = day
                    log.warning("usage ledger: more than %d tenants on %s; new tenants' "
                                "requests are not counted today", self.max_tenants, format_day(day))
                return False
            self._drop_day(oldest)
        return True

    def _trim(self, today: int) -> None:
        """Keeps the days of the window that ends ``today``, at most ``max_days`` of them."""
        for day in sorted(self._days):
            if day <= today - self.max_days or len(self._days) > self.max_days:
                self._drop_day(day)

    def _drop_day(self, day: int) -> None:
        for tenant in self._days.pop(day):
            left = self._tenant_days[tenant] - 1
            if left:
                self._tenant_days[tenant] = left
            else:
                del self._tenant_days[tenant]
        self._dirty = True

    # -- reading --------------------------------------------------------------------------
    def rows(self, tenant: str | None = None, first: int | None = None,
             last: int | None = None) -> list[dict]:
        """The rows of every tenant (``tenant`` None) or of that one only, for the days from
        ``first`` to ``last`` (day numbers, inclusive; None: unbounded), sorted by date then
        tenant, in the JSON shape of GET /v1/cache/usage."""
        with self._lock:
            self._trim(int(self._clock() // _DAY_S))
            picked = [(day, name, list(counts)) for day, rows in self._days.items()
                      if (first is None or day >= first) and (last is None or day <= last)
                      for name, counts in rows.items() if tenant is None or name == tenant]
        return [_row_json(day, name, counts) for day, name, counts in sorted(picked)]

    def tenants(self) -> int:
        return len(self._tenant_days)

    # -- persistence ----------------------------------------------------------------------
    def _changed(self) -> None:
        """Marks a change (under ``_lock``) and starts the writer unless one runs."""
        self._dirty = True
        if self.path is not None and self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                            name="radixgate-usage-ledger")
            self._writer.start()

    def _write_loop(self) -> None:
        """The writer thread: writes, then again every ``flush_interval_s`` while there are
        changes; ends (and the next change starts another) once there are none."""
        try:
            while True:
                self.flush()
                time.sleep(self.flush_interval_s)
                with self._lock:
                    if not self._dirty:
                        self._writer = None
                        return
        except Exception:  # noqa: BLE001 - a bug here must not stop the next writer
            log.exception("usage ledger: the writer failed")
            with self._lock:
                self._writer = None

    def flush(self) -> bool:
        """Writes the ledger now if it changed (the shutdown flush); False when a write failed
        (logged; the change stays pending)."""
        if self.path is None:
            return True
        with self._write_lock:
            with self._lock:
                if not self._dirty:
                    return True
                data = self._encode()
                self._dirty = False
            try:
                write_private(self.path, data)
            except OSError as e:
                if not self._failing:           # once per run of failures, not every interval
                    log.warning("usage ledger: could not write %s: %s", self.path, e)
                self._failing = True
                with self._lock:
                    self._dirty = True
                return False
            self._failing = False
        return True

    def _encode(self) -> bytes:
        days = {format_day(day): rows for day, rows in sorted(self._days.items())}
        document = {"version": FILE_VERSION, "fields": list(FIELDS), "days": days}
        return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()

    def _load(self) -> None:
        """Loads the file if there is one; a damaged or unreadable one is logged and set
        aside, and the ledger starts empty."""
        try:
            if self.path.stat().st_size > MAX_FILE_BYTES:
                raise DamagedLedger(f"larger than {MAX_FILE_BYTES} bytes")
            days = _decode(self.path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError, RecursionError) as e:
            log.warning("usage ledger %s is damaged or unreadable (%s): starting empty",
                        self.path, e)
            self._set_aside()
            return
        for day in sorted(days):
            for tenant, counts in sorted(days[day].items()):
                row = self._row(day, tenant)
                if row is not None:
                    row[:] = counts
        self._trim(int(self._clock() // _DAY_S))
        self._dirty = False

    def _set_aside(self) -> None:
        try:
            self.path.replace(self.path.with_name(self.path.name + ".damaged"))
        except OSError:
            pass


def _decode(raw: bytes) -> dict[int, dict[str, list[int]]]:
    """The rows of a ledger file (counts in ``FIELDS`` order; a field the file lacks is 0,
    one it has that ``FIELDS`` lacks is ignored); DamagedLedger when it is not one."""
    document = json.loads(raw)
    if not isinstance(document, dict) or document.get("version") != FILE_VERSION:
        raise DamagedLedger("not a version 1 ledger")
    fields, days = document.get("fields"), document.get("days")
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields) \
            or not isinstance(days, dict):
        raise DamagedLedger("no fields or days")
    out: dict[int, dict[str, list[int]]] = {}
    for date, rows in days.items():
        if not isinstance(rows, dict):
            raise DamagedLedger(f"day {date!r} is not an object")
        out[parse_date(date)] = {tenant: _counts(fields, counts) for tenant, counts in rows.items()}
    return out


def _counts(fields: list[str], counts) -> list[int]:
    if not isinstance(counts, list) or len(counts) != len(fields) or not all(
            type(n) is int and n >= 0 for n in counts):
        raise DamagedLedger(f"bad counts {counts!r:.80}")
    by_name = dict(zip(fields, counts))
    return [by_name.get(name, 0) for name in FIELDS]


def _row_json(day: int, tenant: str, counts: list[int]) -> dict:
    named = dict(zip(FIELDS, counts))
    return {"date": format_day(day), "tenant": tenant,
            "requests": named["requests"], "errors": named["errors"],
            "prompt": named["prompt"], "cache_read": named["cache_read"],
            "cache_creation": {"5m": named["cache_creation_5m"], "1h": named["cache_creation_1h"],
                               "24h": named["cache_creation_24h"]},
            "uncached": named["uncached"], "output": named["output"]}
