"""Small stand-ins for the KV manager's collaborators, without a model: a KV "tensor" that
keeps the token ids written into each block (copies and loads move them), and a lower tier
held in a dict that implements the lower-tier protocol (kv/tiers/base.py)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from radixgate.kv import BlockPool, RadixTree, WindowSlots
from radixgate.kv.core.block_hash import block_hashes, root_hash
from radixgate.kv.tiers.base import spill_to
from radixgate.kv.manager import KVManager
from radixgate.kv.tiers.index import TierRecord, TierRun
from radixgate.runtime.engine.api import Request
from radixgate.runtime.engine.sequence import Sequence


class FakeKV:
    """``contents[block]``: the token ids in the block's slots (what K/V would encode);
    ``copies``: each copy-on-write as ``(shared, private, valid_slots)``."""

    def __init__(self, num_blocks: int, block_size: int, window: WindowSlots | None = None):
        self.num_blocks, self.block_size, self.window = num_blocks, block_size, window
        self.contents: dict[int, tuple[int, ...]] = {}
        self.copies: list[tuple[int, int, int]] = []

    def write(self, table: list[int], tokens, start: int, end: int) -> None:
        """A step computed positions ``[start, end)`` of ``tokens`` into ``table``."""
        B = self.block_size
        for pos in range(start, end):
            block = table[pos // B]
            slots = list(self.contents.get(block, ()))[:pos % B]
            self.contents[block] = tuple(slots) + (tokens[pos],)

    def copy_blocks(self, pairs, valid_slots) -> None:
        for (shared, private), valid in zip(pairs.tolist(), valid_slots.tolist()):
            self.contents[private] = self.contents.get(shared, ())[:valid]
            self.copies.append((shared, private, valid))


@dataclass
class FakeLoad:
    """A ``LoadJob`` done at once (or held open by the tier's ``slow`` flag)."""

    run: TierRun
    blocks: list[int]
    block_size: int
    done: threading.Event = field(default_factory=threading.Event)
    loaded: int = 0
    unwindowed: list[int] = field(default_factory=list)
    cancelled: bool = False

    @property
    def length(self) -> int:
        return (self.run.first_index + self.loaded) * self.block_size

    def cancel(self) -> None:
        self.cancelled = True

    def wait(self, timeout: float | None = None) -> bool:
        self.done.set()
        return True


class MemoryTier:
    """A ``LowerTier`` in a dict: full blocks by chain digest, their contents copied out at
    ``spill`` and written back by ``load`` (at once, or when ``finish`` is called when
    ``slow``)."""

    kind = "disk"

    def __init__(self, kv: FakeKV, slow: bool = False):
        self.kv, self.block_size, self.slow = kv, kv.block_size, slow
        self.stored: dict[bytes, tuple[str, bytes, tuple[int, ...]]] = {}
        self.hits = 0
        self.loads: list[FakeLoad] = []
        self.retained: dict[str, float] = {}
        self.closed = False

    def _root(self, namespace: str) -> bytes:
        return root_hash(b"test-model", namespace)

    def holds_namespace(self, namespace: str) -> bool:
        return any(ns == namespace for ns, _, _ in self.stored.values())

    def chain(self, namespace, tokens):
        n = len(tokens) // self.block_size * self.block_size
        return block_hashes(self._root(namespace), tokens[:n], self.block_size)

    def find(self, namespace, tokens, first_index, chain):
        records = []
        for index in range(first_index, len(chain)):
            if chain[index] not in self.stored:
                break
            parent = chain[index - 1] if index else self._root(namespace)
            records.append(TierRecord(chain[index], namespace, parent, self.block_size, 0, True))
        if not records:
            return None
        return TierRun(first_index, tuple(records), (first_index + len(records)) * self.block_size)

    def touch_run(self, run) -> None:
        pass

    def load(self, run, blocks) -> FakeLoad:
        job = FakeLoad(run, list(blocks), self.block_size)
        self.loads.append(job)
        if not self.slow:
            self.finish(job)
        return job

    def finish(self, job: FakeLoad) -> None:
        for block, record in zip(job.blocks, job.run.records):
            self.kv.contents[block] = self.stored[record.digest][2]
            job.loaded += 1
        job.done.set()

    def count_hit(self, tokens: int) -> None:
        self.hits += tokens

    def spill(self, namespace, tokens, start, end, blocks, wait=False) -> int:
        if self.closed:
            return 0
        chain = self.chain(namespace, tokens[:end])
        staged = 0
        for index, block in enumerate(blocks[:len(chain)]):
            if chain[index] not in self.stored:
                self.stored[chain[index]] = (namespace, chain[index], self.kv.contents[block])
                staged += 1
        return staged

    def persist(self, nodes) -> int:
        return sum(self.spill(ns, tokens, start, end, blocks, wait=True)
                   for ns, tokens, start, end, blocks in nodes)

    def purge(self, namespace=None) -> int:
        gone = [d for d, (ns, _, _) in self.stored.items() if namespace in (None, ns)]
        for digest in gone:
            del self.stored[digest]
        return len(gone)

    def retain(self, namespace, tokens, ttl_s) -> None:
        self.retained[namespace] = ttl_s

    def release(self, namespace, tokens) -> None:
        self.retained.pop(namespace, None)

    def stats(self):
        return {"blocks": len(self.stored)}

    def close(self) -> None:
        self.closed = True


def main_pool(num_blocks: int, block_size: int, window: WindowSlots | None = None) -> BlockPool:
    return BlockPool(num_blocks, block_size,
                     on_free=window.on_main_free if window is not None else None)


def tree_over(pool: BlockPool, tier=None, events=None) -> RadixTree:
    return RadixTree(pool, on_event=events, spill=spill_to(tier))


# -- a manager without a model, and what the engine does around it ---------------------
B = 4


def seq_of(tokens, namespace: str = "ns", rid: int = 0) -> Sequence:
    return Sequence(Request(list(tokens), namespace=namespace), arrival=rid)


def manager(num_blocks: int = 32, *, window: WindowSlots | None = None, tier_slow=None,
            cls=KVManager, events=None):
    kv = FakeKV(num_blocks, B, window)
    pool = main_pool(num_blocks, B, window)
    tier = MemoryTier(kv, slow=tier_slow) if tier_slow is not None else None
    tree = tree_over(pool, tier, events)
    return cls(tree, pool, kv, tier=tier), kv


def compute(m: KVManager, kv: FakeKV, seq: Sequence, upto: int | None = None) -> None:
    """What the engine's steps do: K/V for positions up to ``upto`` (all tokens)."""
    end = len(seq.tokens) if upto is None else upto
    assert m.grow(seq, end)
    kv.write(seq.kv.block_table, seq.tokens, seq.num_computed, end)
    seq.num_computed = end


def run(m: KVManager, kv: FakeKV, seq: Sequence) -> None:
    """Admit with the longest match, compute everything, release into the tree."""
    assert m.admit(seq, m.match(seq))
    compute(m, kv, seq)
    m.release(seq)


def conserved(m: KVManager, *running: Sequence) -> None:
    tables = [s.kv.block_table for s in running]
    m.tree.check_integrity(extra_holders=tables)
    held = m.tree.held_blocks().union(*map(set, tables))
    assert m.pool.num_free() + len(held) == m.pool.num_blocks
    if not running:
        assert not m.tree.handles
    window = getattr(m.kv, "window", None)
    if window is not None:
        window.check(m.tree.held_blocks(),
                     [[s.kv.block_table[i] for i in s.kv.window_held] for s in running])
