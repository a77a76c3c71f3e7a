"""The discrete-event model behind ``benchmarks.router_sim``: replicas with real radix trees.

Each simulated replica has its own ``BlockPool`` and ``RadixTree`` (the engine's code: the
same matching, locking, eviction policy and ``CacheEvent``s), a FIFO prefill server and a
decode batch. Latency model, calibrated from measured rates (``Rates``): a prefill takes
``overhead + uncached tokens / prefill_tok_s``; a request then decodes ``max_tokens``
steps of ``step_s + per_seq_s x decoding requests``, holding its KV blocks; a session's next
request arrives ``think_s`` after its answer. A request's cached prefix is the tree's
match when its prefill starts (``min(match, len - 1)``, as in the engine); its prompt is
inserted when its prefill ends. Routers see loads (requests in flight per replica) and, for
the prefix router, the replicas' KV events as they happen.
"""
from __future__ import annotations

import heapq
import itertools
import random
from array import array
from collections import deque
from dataclasses import dataclass, field

from radixgate.kv import BlockPool, RadixTree
from radixgate.kv.events.blocks import BlockTracker


@dataclass(frozen=True)
class Rates:
    prefill_tok_s: float = 1600.0   # RESULTS.md runtime: prefill 512 tokens, 2 threads
    prefill_overhead_s: float = 0.02
    step_s: float = 0.011           # decode: 1 stream 90 tok/s
    per_seq_s: float = 0.0012       # 16 streams 560 tok/s
    think_s: float = 2.0            # mean pause of a client between answer and next request


@dataclass
class SimRequest:
    session: int
    step: int
    namespace: str
    tokens: array
    max_tokens: int
    arrival: float = 0.0
    num_tokens: int = 0
    replica: int = -1
    hit: int = 0
    ttft: float = 0.0
    blocks: list = field(default_factory=list)
    handle: object = None


class Replica:
    def __init__(self, index: int, num_blocks: int, block_size: int, on_event=None):
        self.index = index
        self.pool = BlockPool(num_blocks, block_size)
        self.tree = RadixTree(self.pool, on_event=on_event)
        self.queue: deque[SimRequest] = deque()
        self.prefilling: SimRequest | None = None
        self.decoding = 0
        self.in_flight = 0
        self.busy_s = 0.0
        self.served = 0

    def start_prefill(self, req: SimRequest) -> int:
        """Matches and takes blocks for ``req``; returns the tokens to compute."""
        B, n = self.pool.block_size, len(req.tokens)
        match = self.tree.match(req.namespace, req.tokens)
        req.hit = min(match.length, n - 1)
        keep = req.hit // B
        for block in match.blocks[keep:]:
            self.pool.decref(block)
        need = -(-n // B) - keep
        if self.pool.num_free() < need:
            self.tree.evict(need - self.pool.num_free())
        if self.pool.num_free() < need:          # everything else is locked: no room
            for block in match.blocks[:keep]:
                self.pool.decref(block)
            self.tree.unlock(match.handle)
            req.blocks, req.handle = [], None
            return n - req.hit
        req.blocks = list(match.blocks[:keep]) + self.pool.allocate(need)
        req.handle = match.handle
        return n - req.hit

    def end_prefill(self, req: SimRequest) -> None:
        if req.handle is None:
            return
        inserted = self.tree.insert(req.namespace, req.tokens, req.blocks, lock=True)
        self.tree.unlock(req.handle)
        req.handle = inserted.handle

    def finish(self, req: SimRequest) -> None:
        if req.handle is not None:
            self.tree.unlock(req.handle)
            self.pool.decref_many(req.blocks)
        req.blocks, req.handle = [], None


class Cluster:
    """Runs ``sessions`` (lists of (namespace, tokens, max_tokens)) through ``router``."""

    def __init__(self, sessions, router, num_replicas: int, blocks_per_replica: int,
                 block_size: int, rates: Rates, open_rate: float, seed: int = 0,
                 kv_events: bool = False, on_arrival=None):
        self.sessions = sessions
        self.on_arrival = on_arrival      # (namespace, tokens) of each request as it arrives
        self.router = router
        self.rates = rates
        self.rng = random.Random(seed)
        self.events: list = []
        self.counter = itertools.count()
        self.now = 0.0
        self.arrivals: list[SimRequest] = []
        self.replicas = [Replica(i, blocks_per_replica, block_size,
                                 self._sink(i, block_size) if kv_events else None)
                         for i in range(num_replicas)]
        t = 0.0
        for s in range(len(sessions)):
            t += self.rng.expovariate(open_rate)
            self._at(t, self._arrive, s, 0)

    def _sink(self, index: int, block_size: int):
        tracker = BlockTracker(self.router.seed, block_size)

        def on_event(event) -> None:
            kv = tracker.convert(event)
            if kv is not None:
                self.router.index.apply(index, [kv])
        return on_event

    def _at(self, t: float, fn, *args) -> None:
        heapq.heappush(self.events, (t, next(self.counter), fn, args))

    def run(self) -> "Cluster":
        while self.events:
            self.now, _, fn, args = heapq.heappop(self.events)
            fn(*args)
        return self

    def loads(self) -> dict[int, int]:
        return {r.index: r.in_flight for r in self.replicas}

    def _arrive(self, session: int, step: int) -> None:
        namespace, tokens, max_tokens = self.sessions[session][step]
        req = SimRequest(session, step, namespace, tokens, max_tokens, arrival=self.now)
        req.replica = self.router.choose(req, self.loads())
        req.num_tokens = len(tokens)
        self.arrivals.append(req)
        if self.on_arrival is not None:
            self.on_arrival(namespace, tokens)
        replica = self.replicas[req.replica]
        replica.in_flight += 1
        replica.queue.append(req)
        if replica.prefilling is None:
            self._next_prefill(replica)

    def _next_prefill(self, replica: Replica) -> None:
        if not replica.queue:
            replica.prefilling = None
            return
        req = replica.queue.popleft()
        replica.prefilling = req
        uncached = replica.start_prefill(req)
        duration = self.rates.prefill_overhead_s + uncached / self.rates.prefill_tok_s
        replica.busy_s += duration
        self._at(self.now + duration, self._prefilled, replica, req)

    def _prefilled(self, replica: Replica, req: SimRequest) -> None:
        req.ttft = self.now - req.arrival
        replica.end_prefill(req)
        replica.decoding += 1
        step = self.rates.step_s + self.rates.per_seq_s * replica.decoding
        replica.busy_s += req.max_tokens * self.rates.per_seq_s
        self._at(self.now + req.max_tokens * step, self._finished, replica, req)
        self._next_prefill(replica)

    def _finished(self, replica: Replica, req: SimRequest) -> None:
        replica.finish(req)
        req.tokens = None                 # only its counts are kept
        replica.decoding -= 1
        replica.in_flight -= 1
        replica.served += 1
        if req.step + 1 < len(self.sessions[req.session]):
            self._at(self.now + self.rng.expovariate(1.0 / self.rates.think_s),
                     self._arrive, req.session, req.step + 1)
