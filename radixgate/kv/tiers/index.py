"""What a lower KV tier (disk, or host memory) holds: records addressed by chained block
hashes (``block_hash.py``), in least-recently-used order, within a byte budget.

Pure bookkeeping, no I/O and no torch: the runtime's tier (``radixgate/kv/tiers/disk/``) keeps one
``TierIndex`` beside its storage backend and calls it under its own lock.

- A *full* record holds block ``j`` of a sequence: its digest is ``h[j]`` of the chain, its
  ``parent`` ``h[j - 1]`` (the namespace's root hash for ``j == 0``), ``count == block_size``.
- A *tail* record holds the partly filled last block of a cached prefix: its digest is
  ``tail_hash(parent, tail tokens)``, ``count`` its tokens (1 ..= block_size - 1). Tails are
  found by their parent: ``tails[parent]`` maps each stored count to its digest.
- ``space``: the record's namespace key (namespaces are never stored in clear); a flush of
  a namespace removes its space.
- Retention: a pinned prefix's digests carry ``(until, ttl_s)`` (wall-clock seconds); the
  budget evicts unretained records first (least recently used first), then retained ones by
  soonest expiry. A hit re-arms a retained record's ``until`` (now + ttl_s), as a pin's hit
  does in memory.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.block_hash import block_hashes, tail_hash


@dataclass(slots=True)
class TierRecord:
    digest: bytes
    space: str          # namespace key: the folder / group a flush removes
    parent: bytes       # the chain digest before this block
    count: int          # token slots it holds (block_size for a full block)
    nbytes: int         # bytes it takes in the tier
    full: bool


@dataclass(frozen=True, slots=True)
class BlockAddress:
    """Where block index ``index`` of a sequence lives in a tier: ``digest`` (full: h[j];
    tail: its tail hash), ``parent``, ``count`` valid slots."""

    index: int
    digest: bytes
    parent: bytes
    count: int
    full: bool


def block_addresses(root: bytes, tokens: Sequence[int], start: int, end: int,
                    block_size: int) -> list[BlockAddress]:
    """Addresses of the blocks for indices ``start // B .. (end - 1) // B`` of ``tokens``
    (a path from its namespace's root; only ``tokens[:end]`` are read): full blocks by
    their chain hash, a partly filled last block (``end % B``) by its tail hash."""
    B = block_size
    if end <= start:
        return []
    full_end = end // B
    chain = block_hashes(root, tokens[:full_end * B], B)
    out: list[BlockAddress] = []
    for index in range(start // B, (end - 1) // B + 1):
        parent = chain[index - 1] if index else root
        if index < full_end:
            out.append(BlockAddress(index, chain[index], parent, B, True))
        else:
            out.append(BlockAddress(index, tail_hash(parent, tokens[index * B:end]), parent,
                                    end - index * B, False))
    return out


@dataclass(frozen=True, slots=True)
class TierRun:
    """A run of records extending a cached prefix: ``records`` for block indices
    ``first_index ..`` in order; ``length``: tokens covered from position 0 once loaded."""

    first_index: int
    records: tuple[TierRecord, ...]
    length: int


class TierIndex:
    """Records of one tier (see the module docstring). Not thread-safe: the owner locks."""

    def __init__(self, budget_bytes: int, block_size: int):
        self.budget_bytes = int(budget_bytes)
        self.block_size = block_size
        self.records: OrderedDict[bytes, TierRecord] = OrderedDict()   # oldest use first
        self.tails: dict[bytes, dict[int, bytes]] = {}
        self.spaces: dict[str, set[bytes]] = {}
        self.retention: dict[bytes, tuple[float, float]] = {}         # digest -> (until, ttl)
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self.records)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self.records

    def get(self, digest: bytes) -> TierRecord | None:
        return self.records.get(digest)

    def has_space(self, space: str) -> bool:
        return space in self.spaces

    # ---- adding and removing ----------------------------------------------------------
    def add(self, record: TierRecord) -> None:
        """Index ``record`` as the most recently used (replacing one of the same digest)."""
        if record.digest in self.records:
            self.remove(record.digest)
        self.records[record.digest] = record
        self.nbytes += record.nbytes
        self.spaces.setdefault(record.space, set()).add(record.digest)
        if not record.full:
            self.tails.setdefault(record.parent, {})[record.count] = record.digest

    def remove(self, digest: bytes) -> TierRecord | None:
        record = self.records.pop(digest, None)
        if record is None:
            return None
        self.nbytes -= record.nbytes
        members = self.spaces.get(record.space)
        if members is not None:
            members.discard(digest)
            if not members:
                del self.spaces[record.space]
        if not record.full:
            counts = self.tails.get(record.parent)
            if counts is not None and counts.get(record.count) == digest:
                del counts[record.count]
                if not counts:
                    del self.tails[record.parent]
        return record

    def remove_space(self, space: str) -> list[TierRecord]:
        """Forget every record of ``space`` (a flushed namespace); returns them."""
        return [r for r in map(self.remove, list(self.spaces.get(space, ()))) if r is not None]

    def clear(self) -> list[TierRecord]:
        records = list(self.records.values())
        self.records.clear()
        self.tails.clear()
        self.spaces.clear()
        self.nbytes = 0
        return records

    def touch(self, digest: bytes, now: float) -> None:
        """A hit: most recently used now; a retained record's expiry is re-armed."""
        if digest in self.records:
            self.records.move_to_end(digest)
        kept = self.retention.get(digest)
        if kept is not None:
            self.retention[digest] = (now + kept[1], kept[1])

    # ---- budget and retention ---------------------------------------------------------
    def victims(self, incoming: int, now: float) -> list[TierRecord]:
        """Records to remove (not removed yet) so that ``incoming`` more bytes fit the
        budget: unretained least recently used first, then retained ones whose retention
        ends soonest. Empty when it fits already; everything when it can never fit."""
        excess = self.nbytes + incoming - self.budget_bytes
        if excess <= 0:
            return []
        chosen: list[TierRecord] = []
        retained: list[TierRecord] = []
        for record in self.records.values():
            if excess <= 0:
                return chosen
            if self.retained(record.digest, now):
                retained.append(record)
                continue
            chosen.append(record)
            excess -= record.nbytes
        retained.sort(key=lambda r: self.retention[r.digest][0])
        for record in retained:
            if excess <= 0:
                break
            chosen.append(record)
            excess -= record.nbytes
        return chosen

    def retain(self, digests: Sequence[bytes], ttl_s: float, now: float) -> None:
        """Keep ``digests`` (stored now or later) for ``ttl_s`` after their latest hit."""
        for digest in digests:
            until, kept = self.retention.get(digest, (0.0, 0.0))
            self.retention[digest] = (max(until, now + ttl_s), max(kept, ttl_s))
        self.prune_retention(now)

    def retained(self, digest: bytes, now: float) -> bool:
        kept = self.retention.get(digest)
        return kept is not None and kept[0] > now

    def prune_retention(self, now: float) -> None:
        """Drop expired retention entries (bounded by the pin quotas, so cheap)."""
        expired = [d for d, (until, _) in self.retention.items() if until <= now]
        for digest in expired:
            del self.retention[digest]

    def retained_count(self, now: float) -> int:
        return sum(1 for d in self.retention if d in self.records and self.retained(d, now))

    # ---- finding a run ----------------------------------------------------------------
    def longest_run(self, chain: Sequence[bytes], root: bytes, tokens: Sequence[int],
                    first_index: int, also: TierIndex | None = None) -> TierRun | None:
        """The stored records extending a prefix from block index ``first_index``:
        consecutive full blocks of ``chain`` (the sequence's full-block hashes), then the
        longest stored tail after the last of them that ``tokens`` start with. None when
        nothing is stored at ``first_index``. ``also``: a second index whose records count
        as stored too (the tier's staged writes); a run may mix both."""
        B = self.block_size
        records: list[TierRecord] = []
        index = first_index
        while index < len(chain):
            record = self.records.get(chain[index])
            if record is None and also is not None:
                record = also.records.get(chain[index])
            if record is None:
                break
            records.append(record)
            index += 1
        parent = chain[index - 1] if index else root
        tails = [t for t in (self.longest_tail(parent, tokens, index * B),
                             also.longest_tail(parent, tokens, index * B) if also else None)
                 if t is not None]
        tail = max(tails, key=lambda t: t.count) if tails else None
        if tail is not None:
            records.append(tail)
        if not records:
            return None
        length = index * B + (tail.count if tail is not None else 0)
        return TierRun(first_index, tuple(records), length)

    def longest_tail(self, parent: bytes, tokens: Sequence[int], begin: int) -> TierRecord | None:
        counts = self.tails.get(parent)
        if not counts:
            return None
        room = min(len(tokens) - begin, self.block_size - 1)
        for count in sorted((c for c in counts if c <= room), reverse=True):
            digest = tail_hash(parent, tokens[begin:begin + count])
            if counts.get(count) == digest:
                return self.records.get(digest)
        return None
