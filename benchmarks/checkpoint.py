"""Request-level checkpoints for server variants that keep nothing between requests.

A full-size cache-off workload takes up to two hours on 2 cores (agents: 176 prompts of
~4.5k tokens, each prefilled whole), longer than many sessions that run it. ``--resume``
saves a (variant, workload) pair only when it is whole, so a kill mid-way would lose every
request of it. On a variant whose server holds no state from one request to the next
(``--no-prefix-cache``), what a request costs does not depend on which requests ran
before it on the same server (only on those running beside it), so the pair can be split: each answered request is appended to
``OUT/partial/<variant>.<workload>.jsonl`` as it ends, and a resumed run sends only the
requests missing there, then summarizes old and new together.

A cache-on variant is never split: its later requests' hits depend on what the earlier
ones left in the cache, and a fresh server would start them cold.

Each line is one answered request: its index in the workload's arrival order, a digest of
the request (system, messages, tools, output budget: checked on load, so a line of a
changed workload is not merged), the ``RequestResult`` fields, and,
counted from its segment's (invocation's) start to the request's end: seconds, the
server's CPU seconds, and the peak KV blocks seen. The pair's wall time and CPU are sums
over segments of each segment's last line. The requests in flight at a kill are sent
again, so what they had cost up to the segment's last answer counts twice: at most
``concurrency - 1`` requests' share per kill (3 of 176 requests on the full-size agents
pair). Failed requests are not recorded: they are sent again, and the time and CPU they
took count too. A line cut short by a kill is dropped.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

STATELESS_VARIANTS = frozenset({"cache_off"})
PARTIAL_DIR = "partial"


def request_digest(request) -> str:
    """A short hash of what a ``ChatRequest`` sends."""
    text = json.dumps(dataclasses.asdict(request), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def checkpoint_path(out_dir: Path, variant: str, workload_name: str) -> Path:
    return Path(out_dir) / PARTIAL_DIR / f"{variant}.{workload_name}.jsonl"


@dataclass(kw_only=True)
class Unsaved:
    """A (variant, workload) pair that is not checkpointed: nothing answered before, nothing
    recorded. ``PairCheckpoint`` adds the saving; both time the server's CPU over the run."""
    done: dict[int, dict] = field(default_factory=dict)   # index -> RequestResult dict
    prior_wall_s: float = 0.0
    prior_cpu_s: float | None = 0.0          # None when a saved line lacks it
    prior_kv_blocks_peak: int | None = None
    segments: int = 0                        # invocations that saved lines before this one
    cpu_clock: Callable[[], float] | None = None    # the server's CPU seconds so far
    cpu_start: float = 0.0

    def start_segment(self, cpu_clock: Callable[[], float] | None = None) -> None:
        """Called before this invocation's first request: ``cpu_clock`` reads the server's
        CPU seconds, so that each line says how much this segment has cost so far."""
        self.cpu_clock = cpu_clock
        self.cpu_start = cpu_clock() if cpu_clock else 0.0

    def segment_cpu_s(self) -> float | None:
        """The server's CPU seconds since ``start_segment`` (None without a clock)."""
        return self.cpu_clock() - self.cpu_start if self.cpu_clock else None

    def total_cpu_s(self) -> float | None:
        """This segment's CPU seconds plus the earlier segments' (None if any is unknown)."""
        segment = self.segment_cpu_s()
        if segment is None or self.prior_cpu_s is None:
            return None
        return round(segment + self.prior_cpu_s, 2)

    def record(self, index: int, result: dict, elapsed_s: float,
               kv_blocks_peak: int | None) -> None:
        """Nothing to save."""

    def discard(self) -> None:
        """Nothing to remove."""


@dataclass(kw_only=True)
class PairCheckpoint(Unsaved):
    """The saved requests of one (variant, workload) pair and the file new ones go to."""
    path: Path
    digests: list[str]                                    # per request, arrival order
    on_record: Callable[[], None] = lambda: None          # after each appended line

    @classmethod
    def open(cls, out_dir: Path, variant: str, workload,
             on_record: Callable[[], None] = lambda: None) -> "PairCheckpoint":
        """The checkpoint of ``variant`` on ``workload`` under ``out_dir``, with what earlier
        invocations saved (nothing when there is no file)."""
        checkpoint = cls(path=checkpoint_path(out_dir, variant, workload.name),
                         digests=[request_digest(r) for r in workload.requests],
                         on_record=on_record)
        if checkpoint.path.exists():
            checkpoint._load()
        return checkpoint

    def _load(self) -> None:
        wall: dict[int, float] = {}
        cpu: dict[int, float | None] = {}
        for record in self._valid_lines():
            index, segment = record.pop("index"), record.pop("segment")
            wall[segment] = max(wall.get(segment, 0.0), record.pop("elapsed_s"))
            cpu_s, so_far = record.pop("cpu_s", None), cpu.setdefault(segment, 0.0)
            cpu[segment] = None if cpu_s is None or so_far is None else max(so_far, cpu_s)
            peak = record.pop("kv_blocks_peak")
            if peak is not None:
                self.prior_kv_blocks_peak = max(self.prior_kv_blocks_peak or 0, peak)
            record.pop("digest")
            self.done[index] = record
        self.prior_wall_s = sum(wall.values())
        self.prior_cpu_s = None if None in cpu.values() else sum(cpu.values())
        self.segments = max(wall, default=-1) + 1

    def _valid_lines(self) -> Iterable[dict]:
        """The parsed lines that belong to this workload; a last line cut short by a kill
        is cut off the file, so that the next append starts a line of its own."""
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            data = data[:data.rfind(b"\n") + 1]
            os.truncate(self.path, len(data))
        for line in data.decode("utf-8", errors="replace").splitlines():
            record = _parse(line)
            if record is not None and 0 <= record["index"] < len(self.digests) \
                    and self.digests[record["index"]] == record["digest"]:
                yield record

    def record(self, index: int, result: dict, elapsed_s: float,
               kv_blocks_peak: int | None) -> None:
        """Append one answered request (``result``: a ``RequestResult`` as a dict); failed
        ones are skipped."""
        if not result.get("ok"):
            return
        segment_cpu_s = self.segment_cpu_s()
        cpu_s = None if segment_cpu_s is None else round(segment_cpu_s, 3)
        line = {"index": index, "digest": self.digests[index], "segment": self.segments,
                "elapsed_s": round(elapsed_s, 4), "cpu_s": cpu_s,
                "kv_blocks_peak": kv_blocks_peak, **result}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
        self.on_record()

    def discard(self) -> None:
        """Remove the file once the pair's summary is saved."""
        self.path.unlink(missing_ok=True)


def _parse(line: str) -> dict | None:
    """A line's record, or None when it is not a whole, successful one."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    types = {"index": int, "segment": int, "elapsed_s": (int, float), "digest": str}
    if not isinstance(record, dict) or "kv_blocks_peak" not in record:
        return None
    if any(not isinstance(record.get(k), t) for k, t in types.items()):
        return None
    return record if record.get("ok") is True else None


def discard_finished(out_dir: Path, finished: Iterable[str]) -> None:
    """Remove the files of pairs (``variant/workload``) whose summaries are saved: a kill
    between saving a summary and discarding its file leaves one behind."""
    for pair in finished:
        variant, _, workload = pair.partition("/")
        checkpoint_path(out_dir, variant, workload).unlink(missing_ok=True)


def discard_all(out_dir: Path) -> None:
    """Remove every checkpoint under ``out_dir`` (a run that starts over)."""
    shutil.rmtree(Path(out_dir) / PARTIAL_DIR, ignore_errors=True)
