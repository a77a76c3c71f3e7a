"""Which sequences compute which tokens in the next step (continuous batching).

Each step spends at most ``max_step_tokens``: first one token for every decoding sequence
(oldest first), then prefill chunks of running sequences, then new admissions. A step in
which no sequence decodes spends up to ``solo_step_tokens`` instead, in bigger chunks: no
decode waits on it. Admission is
fair across tenants (the tenant with the fewest running requests goes first, ties broken
round-robin) and longest-cached-prefix-first inside a tenant (a preempted request first of
all). A waiting request whose prompt shares notably more with a prompt now being prefilled
than with the tree waits for that prefill to be inserted, so a shared prefix is computed
once. When a decoding sequence needs a block and eviction cannot free one, the newest
running sequence is preempted: its computed prefix goes into the tree and it is requeued at
the front of its tenant's queue. A sequence admitted with its prefix loading from the lower
KV tier (``seq.kv.tier_load``) runs no chunk until the load is done (``KVManager.finish_load``);
the others go on meanwhile.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from radixgate.kv.manager import KVManager
from .engine_config import EngineConfig
from .sequence import Sequence, SeqStatus
from .spec import Drafter

MAX_ADMISSION_FAILURES = 3   # a request whose admission raises this often fails alone
PROMPT_LOGPROBS_CHUNK = 32   # prefill tokens a step for a request that wants prompt logprobs
CANDIDATE_WINDOW = 16   # waiting requests of a tenant considered for longest-prefix-first


@dataclass(slots=True)
class Chunk:
    """``num_tokens`` new tokens of ``seq`` starting at ``seq.num_computed``, then its
    ``drafts`` (speculative tokens verified in the same forward: radixgate/runtime/engine/spec.py)."""

    seq: Sequence
    num_tokens: int
    drafts: tuple[int, ...] = ()

    @property
    def samples(self) -> bool:
        return self.seq.num_computed + self.num_tokens == len(self.seq.tokens)


@dataclass(slots=True)
class StepPlan:
    chunks: list[Chunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    unfit: Sequence | None = None   # could not be admitted although nothing else runs
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)  # admission raised
    retried: bool = False           # an admission raised and is tried again next step

    @property
    def stalled(self) -> bool:
        """Nothing to compute and nothing changed: the next plan is the same one until a
        command arrives or the clock passes a deadline or a pin's expiry."""
        return (not (self.chunks or self.preempted or self.failed or self.retried)
                and self.unfit is None)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: KVManager):
        self.config = config
        self.blocks = blocks
        self.waiting: dict[str, list[Sequence]] = defaultdict(list)
        self.running: list[Sequence] = []          # admission order (newest last)
        self.running_by_tenant: dict[str, int] = defaultdict(int)
        self._served: dict[str, int] = defaultdict(int)   # tenant -> last admission tick
        self._tick = 0
        self.shared_drafts = None    # spec.NamespaceDrafts: earlier requests' tokens
        self.interactive_blocked = False   # this pass: an interactive request found no room

    # -- queue bookkeeping ----------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def waiting_of(self, tenant: str) -> int:
        return len(self.waiting.get(tenant, ()))

    def has_work(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def add(self, seq: Sequence) -> None:
        seq.status = SeqStatus.WAITING
        self.waiting[seq.tenant].append(seq)

    def remove(self, seq: Sequence) -> None:
        """Forget seq (finished, aborted, failed); the caller releases its blocks."""
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.running_by_tenant[seq.tenant] -= 1
        elif seq.status is SeqStatus.WAITING:
            queue = self.waiting[seq.tenant]
            queue.remove(seq)
            if not queue:
                del self.waiting[seq.tenant]
        seq.status = SeqStatus.FINISHED

    def all_sequences(self) -> list[Sequence]:
        return self.running + [s for q in self.waiting.values() for s in q]

    # -- the plan -------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        plan = StepPlan()
        self.interactive_blocked = False
        self.blocks.forget_probes()     # the tree changed since the last pass
        solo = not any(seq.kv.prefill_inserted for seq in self.running)
        cap = self.config.solo_chunk_tokens if solo else self.config.chunk_tokens
        budget = self.config.solo_budget if solo else self.config.max_step_tokens
        budget = self._schedule_decodes(plan, budget)
        budget = self._schedule_prefills(plan, budget, cap)
        if not plan.preempted:   # memory is short: admitting now would only thrash
            self._schedule_admissions(plan, budget, cap)
        if self.blocks.holds_per_step:
            self._reserve_windows(plan)
        return plan

    def _reserve_windows(self, plan: StepPlan) -> None:
        """Each chunk's window data (the window layers' pool, ``KVManager.reserve``),
        oldest sequence first; while the pool cannot make room, the newest running sequence
        is preempted (as for main blocks); a sequence short of room while it runs alone never
        fits (``plan.unfit``)."""
        for chunk in list(plan.chunks):
            seq = chunk.seq
            end = seq.num_computed + chunk.num_tokens + len(chunk.drafts)
            while seq.status is SeqStatus.RUNNING and not self.blocks.reserve(seq, end):
                alone = len(self.running) == 1
                self.preempt(self._victim(), plan)
                if alone:
                    plan.unfit = seq

    def _schedule_decodes(self, plan: StepPlan, budget: int) -> int:
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SeqStatus.RUNNING or not seq.kv.prefill_inserted:
                continue
            n = min(seq.remaining_prefill, budget)   # > 1 after a grammar's forced tokens
            if self._reserve_block(seq, plan, n):
                drafts = self._drafts(seq, budget - n) if n == 1 else ()
                plan.chunks.append(Chunk(seq, n, drafts))
                budget -= n + len(drafts)
        return budget

    def _drafts(self, seq: Sequence, room: int) -> tuple[int, ...]:
        """Speculative tokens for seq's decode step (radixgate/runtime/engine/spec.py): none when spec
        is off (for the server or the request), past ``max_tokens``, beyond the step's
        ``room``, or when their blocks are not free while one block per running sequence
        stays free (a draft never evicts, so never preempts). A constrained row's draft ends
        at its first token the grammar forbids."""
        spec = self.config.spec
        if not spec.enabled or seq.params.speculative is False:
            return ()
        limit = min(room, seq.params.max_tokens - seq.num_output - 1)
        if limit <= 0:
            return ()
        if seq.drafter is None:
            seq.drafter = Drafter(spec)
        drafts = seq.drafter.propose(seq.tokens, limit, self.shared_drafts, seq.namespace,
                                     batch=len(self.running))
        if drafts and seq.grammar is not None:
            drafts = drafts[:seq.grammar.matcher.validate_tokens(drafts)]
        if drafts and self.blocks.grow_from_free(seq, seq.num_computed + 1 + len(drafts),
                                                 keep_free=len(self.running)):
            return tuple(drafts)
        return ()

    def _victim(self) -> Sequence:
        """Who gives way when memory is short: the newest batch sequence, else the newest."""
        for seq in reversed(self.running):
            if seq.request.priority:
                return seq
        return self.running[-1]

    def _reserve_block(self, seq: Sequence, plan: StepPlan, n: int = 1) -> bool:
        """Ensure seq has blocks for its next ``n`` positions, preempting the newest running
        batch sequence (else the newest) while eviction alone cannot. False when seq itself
        was preempted."""
        while not self.blocks.grow(seq, seq.num_computed + n):
            victim = self._victim()
            self.preempt(victim, plan)
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence, plan: StepPlan) -> None:
        self.running.remove(seq)
        self.running_by_tenant[seq.tenant] -= 1
        plan.chunks = [c for c in plan.chunks if c.seq is not seq]
        self.blocks.release(seq, cache=True)
        seq.status = SeqStatus.WAITING
        seq.num_preemptions += 1
        self.waiting[seq.tenant].insert(0, seq)
        plan.preempted.append(seq)

    def _schedule_prefills(self, plan: StepPlan, budget: int, cap: int) -> int:
        for seq in sorted(self.running, key=lambda s: s.request.priority):   # interactive first
            if budget == 0:
                break
            if not seq.kv.prefill_inserted and self.blocks.finish_load(seq):
                n = min(seq.remaining_prefill, self._chunk_limit(seq, cap), budget)
                plan.chunks.append(Chunk(seq, n))
                budget -= n
        return budget

    def _schedule_admissions(self, plan: StepPlan, budget: int, cap: int) -> None:
        held: set[int] = set()
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self._admit_next(held, plan)
            if seq is None:
                return
            if seq.kv.tier_load is not None:
                continue                # its prefix is loading: it computes once loaded
            n = min(seq.remaining_prefill, self._chunk_limit(seq, cap), budget)
            plan.chunks.append(Chunk(seq, n))
            budget -= n

    def _chunk_limit(self, seq: Sequence, cap: int) -> int:
        """Prefill tokens seq may compute in one step. A request that wants prompt logprobs
        needs the output layer on every prompt row (49k logits each), so its chunks stay
        small: the extra work each step adds to the batch it shares is bounded."""
        if seq.params.prompt_logprobs is not None:
            return min(cap, PROMPT_LOGPROBS_CHUNK)
        return cap

    # -- admission ------------------------------------------------------------------------
    def _tenant_order(self) -> list[str]:
        """Tenants with waiting requests and room under max_running: fewest running first,
        then the one served longest ago."""
        eligible = []
        for tenant, queue in self.waiting.items():
            limit = self.config.quota_for(tenant).max_running
            if queue and (limit is None or self.running_by_tenant[tenant] < limit):
                eligible.append(tenant)
        return sorted(eligible, key=lambda t: (self.running_by_tenant[t], self._served[t]))

    def _candidates(self, tenant: str) -> list[Sequence]:
        """Interactive before batch; inside each, preempted requests first (queue order),
        then longest cached prefix first. Batch work waits while an interactive request of
        any tenant waits for room (``self.interactive_blocked``)."""
        queue = self.waiting[tenant]
        interactive = [s for s in queue if not s.request.priority][:CANDIDATE_WINDOW]
        batch = [] if self.interactive_blocked else [
            s for s in queue if s.request.priority][:CANDIDATE_WINDOW]
        return self._ordered(interactive) + self._ordered(batch)

    def _ordered(self, window: list[Sequence]) -> list[Sequence]:
        resumed = [s for s in window if s.num_preemptions > 0]
        fresh = [s for s in window if s.num_preemptions == 0]
        if len(fresh) > 1:
            fresh.sort(key=lambda s: (-self.blocks.peek_length(s), s.arrival))
        return resumed + fresh

    def _admit_next(self, held: set[int], plan: StepPlan) -> Sequence | None:
        for tenant in self._tenant_order():
            for seq in self._candidates(tenant):
                if id(seq) in held or self._still_held(seq):
                    held.add(id(seq))
                    continue
                try:
                    outcome = self._try_admit(seq, plan)
                except Exception as exc:  # noqa: BLE001 - seq alone (its match is given back)
                    seq.admission_failures += 1
                    if seq.admission_failures >= MAX_ADMISSION_FAILURES:
                        plan.failed.append((seq, exc))
                    else:
                        plan.retried = True
                    held.add(id(seq))
                    continue
                if outcome == "held":
                    held.add(id(seq))
                    continue
                return seq if outcome == "admitted" else None
        return None

    def _still_held(self, seq: Sequence) -> bool:
        leader = seq.waiting_on
        if leader is not None and leader.is_prefilling:
            return True
        seq.waiting_on = None
        return False

    def _try_admit(self, seq: Sequence, plan: StepPlan) -> str:
        """'admitted', 'held' (waits for a running prefill of its prefix) or 'no_room'.

        On an idle engine a request that does not fit with its cached prefix (the match
        locks that prefix, so eviction cannot take it) is admitted without reuse when that
        fits (everything unpinned can then be evicted); one that fits neither way is
        ``plan.unfit``: nothing that finishes later would make room for it."""
        idle = not self.running
        if not self.blocks.may_fit(seq) and not (idle and self.blocks.may_fit(seq, reuse=False)):
            if idle:
                plan.unfit = seq
            return self._no_room(seq, plan)
        found = self.blocks.match(seq)
        try:
            matched = found.length if found is not None else 0
            leader = self._prefilling_leader(seq, matched) if found is not None else None
        except BaseException:
            self.blocks.release_match(found)
            raise
        if leader is not None:
            self.blocks.release_match(found)
            seq.waiting_on = leader
            return "held"
        if not self.blocks.admit(seq, found) and not (idle and self.blocks.admit(seq, None)):
            if idle:
                plan.unfit = seq
            return self._no_room(seq, plan)
        self._start(seq)
        return "admitted"

    def _no_room(self, seq: Sequence, plan: StepPlan) -> str:
        """An interactive request without room: batch work waits, and the newest running
        batch sequence gives way (its blocks go to the tree, evictable next step)."""
        if not seq.request.priority:
            self.interactive_blocked = True
            batch = [s for s in self.running if s.request.priority]
            if batch:
                self.preempt(batch[-1], plan)
        return "no_room"

    def _prefilling_leader(self, seq: Sequence, matched: int) -> Sequence | None:
        """A running sequence of the same namespace whose pending prefill covers at least
        ``share_wait_tokens`` more of seq's prompt than the tree does."""
        threshold = self.config.share_wait_tokens
        for other in self.running:
            if other.is_prefilling and other.namespace == seq.namespace:
                shared = _common_prefix(seq.tokens, other.tokens)
                if min(shared, len(seq.tokens) - 1) - matched >= threshold:
                    return other
        return None

    def _start(self, seq: Sequence) -> None:
        queue = self.waiting[seq.tenant]
        queue.remove(seq)
        if not queue:
            del self.waiting[seq.tenant]
        seq.status = SeqStatus.RUNNING
        seq.kv.prefill_inserted = False
        self.running.append(seq)
        self.running_by_tenant[seq.tenant] += 1
        self._tick += 1
        self._served[seq.tenant] = self._tick


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists (compares in halves, not per token)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
