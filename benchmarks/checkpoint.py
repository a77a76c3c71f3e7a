"""Request-level checkpoints for server variants that keep nothing between requests.

A full-size cache-off workload takes up to two hours on 2 cores (agents: 176 prompts of
~4.5k tokens, each prefilled whole), longer than many sessions that run it. ``--resume``
saves a (variant, workload) pair only when it is whole, so a kill mid-way would lose every
request of it. On a variant whose server holds no state from one request to the next
(``--no-prefix-cache``), a request's figures do not depend on which requests ran before it
on the same server, so the pair can be split: each answered request is appended to
``OUT/partial/<variant>.<workload>.jsonl`` as it ends, and a resumed run sends only the
requests missing there, then summarizes old and new together.

A cache-on variant is never split: its later requests' hits depend on what the earlier
ones left in the cache, and a fresh server would start them cold.

Each line is one answered request: its index in the workload's arrival order, its session
(checked on load, so a changed workload is not merged), the ``RequestResult`` fields, and,
counted from its segment's (invocation's) start to the request's end: seconds, the
server's CPU seconds, and the peak KV blocks seen. The pair's wall time and CPU are sums
over segments of each segment's last line. The requests in flight at a kill are sent
again, so what they had cost up to the segment's last answer counts twice: a share of at
most ``concurrency - 1`` requests, about 1-2% of a 176-request cache-off pair. Failed
requests are not recorded (they are sent again). A line cut short by a kill is ignored.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

STATELESS_VARIANTS = frozenset({"cache_off"})
PARTIAL_DIR = "partial"


@dataclass
class PairCheckpoint:
    """The saved requests of one (variant, workload) pair and the file new ones go to."""
    path: Path
    done: dict[int, dict] = field(default_factory=dict)      # index -> RequestResult dict
    prior_wall_s: float = 0.0
    prior_kv_blocks_peak: int | None = None
    prior_cpu_s: float | None = 0.0          # None when a saved line lacks it
    segments: int = 0
    cpu_clock: Callable[[], float] | None = None    # the server's CPU seconds so far
    cpu_start: float = 0.0

    @classmethod
    def open(cls, out_dir: Path, variant: str, workload) -> "PairCheckpoint":
        """The checkpoint of ``variant`` on ``workload`` under ``out_dir`` (empty when there
        is none); lines whose session differs from the workload's request at that index
        are dropped."""
        path = Path(out_dir) / PARTIAL_DIR / f"{variant}.{workload.name}.jsonl"
        checkpoint = cls(path)
        checkpoint._load([r.session for r in workload.requests])
        return checkpoint

    def _load(self, sessions: list[str]) -> None:
        if not self.path.exists():
            return
        text = self.path.read_text()
        if not text.endswith("\n"):          # a line cut short by a kill: drop it, so
            text = text[:text.rfind("\n") + 1]   # that the next line starts a line
            self.path.write_text(text)
        wall_by_segment: dict[int, float] = {}
        cpu_by_segment: dict[int, float | None] = {}
        for line in text.splitlines():
            record = _parse(line)
            if record is None:
                continue
            index = record.pop("index")
            if not 0 <= index < len(sessions) or sessions[index] != record.get("session"):
                continue
            segment = record.pop("segment")
            wall_by_segment[segment] = max(wall_by_segment.get(segment, 0.0),
                                           record.pop("elapsed_s"))
            cpu = record.pop("cpu_s", None)
            cpu_by_segment[segment] = (None if cpu is None or segment in cpu_by_segment
                                       and cpu_by_segment[segment] is None
                                       else max(cpu_by_segment.get(segment, 0.0), cpu))
            peak = record.pop("kv_blocks_peak")
            if peak is not None:
                self.prior_kv_blocks_peak = max(self.prior_kv_blocks_peak or 0, peak)
            self.done[index] = record
        self.prior_wall_s = sum(wall_by_segment.values())
        cpus = list(cpu_by_segment.values())
        self.prior_cpu_s = None if None in cpus else sum(cpus)
        self.segments = max(wall_by_segment, default=-1) + 1

    def start_segment(self, cpu_clock: Callable[[], float] | None = None) -> None:
        """Called as this invocation starts sending: ``cpu_clock`` reads the server's CPU
        seconds, so that each line says how much this segment has cost so far."""
        self.cpu_clock = cpu_clock
        self.cpu_start = cpu_clock() if cpu_clock else 0.0

    def record(self, index: int, result: dict, elapsed_s: float,
               kv_blocks_peak: int | None) -> None:
        """Append one answered request (``result``: a ``RequestResult`` as a dict); failed
        ones are skipped."""
        if not result.get("ok"):
            return
        cpu_s = round(self.cpu_clock() - self.cpu_start, 3) if self.cpu_clock else None
        line = {"index": index, "segment": self.segments, "elapsed_s": round(elapsed_s, 4),
                "cpu_s": cpu_s, "kv_blocks_peak": kv_blocks_peak, **result}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    def discard(self) -> None:
        """Remove the file once the pair's summary is saved."""
        self.path.unlink(missing_ok=True)


def _parse(line: str) -> dict | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    keys = ("index", "segment", "elapsed_s", "kv_blocks_peak", "ok", "session")
    if not isinstance(record, dict) or any(k not in record for k in keys):
        return None
    if not isinstance(record["index"], int) or not isinstance(record["segment"], int):
        return None
    if not isinstance(record["elapsed_s"], (int, float)):
        return None
    return record if record["ok"] is True else None


def saved_requests(out_dir: Path) -> dict[str, int]:
    """``variant/workload`` -> answered requests saved for each unfinished pair."""
    counts = {}
    for path in sorted((Path(out_dir) / PARTIAL_DIR).glob("*.jsonl")):
        variant, _, workload = path.stem.partition(".")
        lines = path.read_text().splitlines()
        counts[f"{variant}/{workload}"] = sum(_parse(line) is not None for line in lines)
    return counts


def discard_all(out_dir: Path) -> None:
    """Remove every checkpoint under ``out_dir`` (a run that starts over)."""
    shutil.rmtree(Path(out_dir) / PARTIAL_DIR, ignore_errors=True)
