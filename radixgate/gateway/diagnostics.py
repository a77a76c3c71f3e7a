"""Why a prompt missed the cache: ``GET /v1/cache/diagnostics/{request_id}``.

Every request's prompt is recorded as its parts (the tools section's header and each tool,
each system block, each message's blocks, the stored turns a continuation starts from, the
generation prompt) with a digest of each part's tokens, its breakpoints (offset, TTL,
digest of the prefix they end) and, when it finishes, what the engine read from the cache
(memory and disk) and did with each breakpoint. Text is kept only for requests that opt in
(the ``radixgate-cache-diagnostics: 1`` header), cut to ``TEXT_CHARS`` a part. Bounded:
``KEEP_PER_TENANT`` requests a tenant, for ``KEEP_S`` seconds; pins seen, ``MAX_PINS``.

The report for a request of the caller's own tenant (another tenant's id is a 404, as an
unknown one):
- ``divergence``: the first token not read from the cache (the longest cached prefix the
  engine reused in its namespace), and the part holding it;
- ``compared_with``: the earlier request of the same namespace sharing the most leading
  parts, the first part where the two differ and, when both kept text, that part's first
  differing text on each side (``SNIPPET_CHARS`` around it);
- ``reason``: ``hit`` (read whole), ``new_content`` (read up to where it departs from the
  most similar earlier prompt), ``expired`` / ``evicted`` (less: the cache lost it) or
  ``first``; ``reasons`` counts them per minute for the dashboard;
- ``breakpoints``: each one's part and status: ``read`` (``from_disk`` when the disk tier
  loaded it), ``created`` (pinned now; ``before``: ``new``, ``expired`` when an earlier pin
  of this very prefix had run out, or ``evicted`` when it had not), or ``not_cached`` with
  the engine's ``reason`` (``pin_quota``: the tenant's pin share; ``pin_ceiling``; ``no_cache``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from array import array
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.tools import TOOLS_HEADER

log = logging.getLogger("radixgate.gateway")
HEADER = "radixgate-cache-diagnostics"
# why a prompt read what it read: all of it; up to where it departs from the most similar
# earlier prompt of its namespace (new content: the cache did all it could); less than
# that (the cache lost it: expired or evicted); nothing like it before (first)
REASONS = ("hit", "new_content", "expired", "evicted", "first")
REASON_MINUTES = 60
KEEP_PER_TENANT = 256
KEEP_S = 3600.0
MAX_PINS = 8192
TEXT_CHARS = 4096
SNIPPET_CHARS = 80


@dataclass(frozen=True, slots=True)
class Part:
    label: str
    start: int
    end: int
    digest: str
    text: str | None = None


@dataclass
class Record:
    request_id: str
    tenant: str
    namespace: str
    started: float
    prompt_tokens: int
    parts: tuple[Part, ...]
    breakpoints: tuple[tuple[int, float, str], ...]     # (offset, ttl_s, prefix digest)
    opted_in: bool
    cache_read: int = 0
    disk_read: int = 0
    outcomes: dict = field(default_factory=dict)        # offset -> the engine's pin outcome
    before: dict = field(default_factory=dict)          # offset -> new | expired | evicted
    finished: bool = False
    reason: str = ""                                    # REASONS: why it read what it read
    model: str | None = None       # the model a Messages request named (cache_diagnostics)


def digest(tokens) -> str:
    return hashlib.blake2b(array("i", tokens).tobytes(), digest_size=8).hexdigest()


def part_labels(converted: ConvertedPrompt | None) -> list[tuple[str, str]]:
    """(label, text) of each piece in render order: one per segment of the rendered prompt
    (the tools section: its header, then one ``<tool>`` definition a tool)."""
    if converted is None:
        return []
    labels, tool, block = [], 0, 0
    for piece in converted.conversation.system:
        if piece.text == TOOLS_HEADER:
            labels.append(("tools header", piece.text))
        elif piece.text.startswith("<tool>") and piece.text.endswith("</tool>"):
            labels.append((f"tool {tool}", piece.text))
            tool += 1
        else:
            labels.append((f"system block {block}", piece.text))
            block += 1
    for i, message in enumerate(converted.conversation.messages):
        labels += [(f"message {i} block {j}", p.text) for j, p in enumerate(message.pieces)]
    return labels


def prompt_parts(converted: ConvertedPrompt | None, tokens: list[int],
                 segment_ends: tuple[int, ...], first_start: int,
                 keep_text: bool) -> tuple[Part, ...]:
    """The prompt cut into labelled parts: ``segment_ends`` (the rendered prompt's) end the
    pieces' parts; ``first_start``: where the first piece starts (after the stored turns a
    continuation starts from; 0 otherwise). A prompt the API tokenized itself is one part."""
    labels = part_labels(converted)
    if not labels:
        return (Part("prompt", 0, len(tokens), digest(tokens)),)
    parts, start = [], 0
    if first_start > 0:
        parts.append(Part("stored turns", 0, first_start, digest(tokens[:first_start])))
        start = first_start
    for (label, text), end in zip(labels, segment_ends):
        parts.append(Part(label, start, end, digest(tokens[start:end]),
                          text[:TEXT_CHARS] if keep_text else None))
        start = end
    if start < len(tokens):
        parts.append(Part("generation prompt", start, len(tokens), digest(tokens[start:])))
    return tuple(parts)


class DiagnosticsBook:
    """The recent requests of every tenant (the event loop's only). With ``path`` (in the
    state folder) ``save`` writes the finished records at shutdown and a new book reads
    them back (those still within ``KEEP_S``)."""

    def __init__(self, clock: Callable[[], float] = time.time, path: Path | None = None):
        self.clock = clock
        self.path = path
        self.tenants: dict[str, OrderedDict[str, Record]] = {}
        self.pins: OrderedDict[tuple[str, str], float] = OrderedDict()   # -> expiry
        self._load()

    def save(self) -> None:
        if self.path is None:
            return
        from radixgate.gateway.state_dir import write_private
        rows = [asdict(r) for book in self.tenants.values() for r in book.values()
                if r.finished]
        pins = [[ns, prefix, expiry] for (ns, prefix), expiry in self.pins.items()]
        try:
            write_private(self.path, json.dumps({"records": rows, "pins": pins}).encode())
        except OSError as exc:
            log.warning("cache diagnostics: could not save %s (%s)", self.path, exc)

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text())
            records = [_record_of(row) for row in data["records"]]
            pins = [((ns, prefix), float(expiry)) for ns, prefix, expiry in data["pins"]]
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("cache diagnostics: ignored an unreadable %s (%s)", self.path, exc)
            return
        for record in sorted(records, key=lambda r: r.started):
            self.start(record)
        self.pins.update(pins[-MAX_PINS:])

    def start(self, record: Record) -> None:
        book = self.tenants.setdefault(record.tenant, OrderedDict())
        book[record.request_id] = record
        self._trim(book)

    def finish(self, record: Record, usage) -> None:
        """The request ended: what it read and pinned (and the pins it leaves behind)."""
        record.finished = True
        record.cache_read = usage.cache_read_tokens
        record.disk_read = usage.cache_read_disk_tokens
        record.outcomes = dict(usage.pin_outcomes)
        now = self.clock()
        for offset, ttl_s, prefix in record.breakpoints:
            key = (record.namespace, prefix)
            if offset > record.cache_read:
                expiry = self.pins.get(key)
                record.before[offset] = ("new" if expiry is None else
                                         "expired" if expiry <= record.started else "evicted")
            if offset <= record.cache_read or record.outcomes.get(offset) == "pinned":
                self.pins[key] = now + ttl_s
                self.pins.move_to_end(key)
        while len(self.pins) > MAX_PINS:
            self.pins.popitem(last=False)
        record.reason = self._classify(record)

    def _classify(self, record: Record) -> str:
        if record.cache_read >= record.prompt_tokens - 1:
            return "hit"
        compared = self._compare(record)
        if compared is None:
            return "first"
        diverged = next((i for i, p in enumerate(record.parts)
                         if p.start <= record.cache_read < p.end), len(record.parts))
        if diverged >= compared["same_parts"]:
            return "new_content"
        lost = [record.before.get(o) for o, _, _ in record.breakpoints if o > record.cache_read]
        return "expired" if "expired" in lost else "evicted"

    def reasons(self, tenant: str | None) -> list[dict]:
        """Per minute of the last ``REASON_MINUTES`` with requests, how many finished with each
        reason (``tenant`` None: every tenant)."""
        since = self.clock() - REASON_MINUTES * 60
        books = self.tenants.values() if tenant is None else [self.tenants.get(tenant, {})]
        minutes: dict[int, dict] = {}
        for book in books:
            for record in book.values():
                if record.finished and record.reason and record.started >= since:
                    minute = int(record.started // 60) * 60
                    row = minutes.setdefault(minute, dict.fromkeys(REASONS, 0))
                    row[record.reason] += 1
        return [{"t": minute, **counts} for minute, counts in sorted(minutes.items())]

    def get(self, tenant: str | None, request_id: str) -> Record | None:
        """A finished request of ``tenant`` (None: any tenant, for an admin)."""
        books = self.tenants.values() if tenant is None else [self.tenants.get(tenant, {})]
        for book in books:
            self._trim(book)
            record = book.get(request_id)
            if record is not None and record.finished:
                return record
        return None

    def find(self, tenant: str, request_id: str) -> Record | None:
        """A recent request of ``tenant``, finished or not (its parts are known from its
        admission on)."""
        book = self.tenants.get(tenant)
        if book is None:
            return None
        self._trim(book)
        return book.get(request_id)

    def _trim(self, book: OrderedDict) -> None:
        oldest = self.clock() - KEEP_S
        while book and (len(book) > KEEP_PER_TENANT
                        or next(iter(book.values())).started < oldest):
            book.popitem(last=False)

    def report(self, record: Record) -> dict:
        return {"request_id": record.request_id, "prompt_tokens": record.prompt_tokens,
                "reason": record.reason,
                "cached_tokens": record.cache_read, "from_disk_tokens": record.disk_read,
                "text_kept": record.opted_in,
                "divergence": _divergence(record),
                "compared_with": self._compare(record),
                "breakpoints": [_breakpoint(record, offset, ttl_s)
                                for offset, ttl_s, _ in record.breakpoints],
                "parts": [{"part": p.label, "start": p.start, "end": p.end}
                          for p in record.parts]}

    def _compare(self, record: Record) -> dict | None:
        """The earlier request of the namespace sharing the most leading parts (the latest
        on a tie) and where the two first differ."""
        best, shared = None, -1
        for other in self.tenants.get(record.tenant, {}).values():
            if other is record or other.namespace != record.namespace or \
                    other.started > record.started:
                continue
            same = _leading_same(record.parts, other.parts)
            if same >= shared:
                best, shared = other, same
        if best is None:
            return None
        answer = {"request_id": best.request_id, "same_parts": shared}
        if shared < len(record.parts):
            mine = record.parts[shared]
            answer["first_different_part"] = mine.label
            theirs = best.parts[shared] if shared < len(best.parts) else None
            if theirs is not None and mine.text is not None and theirs.text is not None:
                answer["this_text"], answer["earlier_text"] = _difference(mine.text,
                                                                          theirs.text)
        return answer


def _record_of(row: dict) -> Record:
    """A saved record read back (JSON keys are strings: offsets become ints again)."""
    row = dict(row)
    row["parts"] = tuple(Part(**part) for part in row["parts"])
    row["breakpoints"] = tuple(tuple(mark) for mark in row["breakpoints"])
    row["outcomes"] = {int(k): v for k, v in row["outcomes"].items()}
    row["before"] = {int(k): v for k, v in row["before"].items()}
    return Record(**row)


def _leading_same(a: tuple[Part, ...], b: tuple[Part, ...]) -> int:
    same = 0
    for x, y in zip(a, b):
        if (x.label, x.digest) != (y.label, y.digest):
            break
        same += 1
    return same


def _difference(mine: str, theirs: str) -> tuple[str, str]:
    """Each side from a little before the first differing character, cut short."""
    at = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y),
              min(len(mine), len(theirs)))
    start = max(0, at - SNIPPET_CHARS // 4)
    return mine[start:start + SNIPPET_CHARS], theirs[start:start + SNIPPET_CHARS]


def part_at(record: Record, token: int) -> str | None:
    for part in record.parts:
        if part.start <= token < part.end:
            return part.label
    return None


def _divergence(record: Record) -> dict:
    token = record.cache_read
    if token >= record.prompt_tokens - 1:
        return {"token": token, "part": None, "whole_prompt_read": True}
    return {"token": token, "part": part_at(record, token), "whole_prompt_read": False}


def _breakpoint(record: Record, offset: int, ttl_s: float) -> dict:
    answer = {"token": offset, "part": part_at(record, offset - 1), "ttl_s": ttl_s}
    if offset <= record.cache_read:
        answer["status"] = "read"
        answer["from_disk"] = offset > record.cache_read - record.disk_read
        return answer
    outcome = record.outcomes.get(offset)
    if outcome == "pinned":
        answer.update(status="created", before=record.before.get(offset, "new"))
    else:
        answer.update(status="not_cached", reason=outcome or "not_prefilled",
                      before=record.before.get(offset, "new"))
    return answer


def diagnostics_file(config) -> Path | None:
    """``diagnostics/recent.json`` in the state folder (gateway/state_dir.py), or None."""
    from radixgate.gateway.state_dir import private_folder, state_folder
    try:
        folder = state_folder(config)
    except OSError as exc:
        log.error("cache diagnostics: no state folder (%s): kept in memory only", exc)
        return None
    return None if folder is None else private_folder(folder, "diagnostics") / "recent.json"


def new_record(request_id: str, tenant: str, engine_request, converted, prompt,
               continued: bool, opted_in: bool, now: float) -> Record:
    """The record of one prompt as admitted (``prompt``: its RenderedPrompt; ``continued``:
    a stored turn's continuation, whose first segment ends the stored turns)."""
    tokens, ends, first = prompt.tokens, tuple(prompt.segment_ends), 0
    if continued and ends:
        first, ends = ends[0], ends[1:]
    parts = prompt_parts(converted, tokens, ends, first, opted_in)
    marks = tuple((b.offset, b.ttl_s, digest(tokens[:b.offset]))
                  for b in engine_request.breakpoints)
    return Record(request_id, tenant, engine_request.namespace, now, len(tokens), parts,
                  marks, opted_in)


def opted_in(request) -> bool:
    return request.headers.get(HEADER, "").strip().lower() in ("1", "true", "yes")
