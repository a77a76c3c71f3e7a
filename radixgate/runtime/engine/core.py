"""EngineCore: the engine thread's state and one step of work.

Owns the KV tensors, the block pool, the radix tree, the block manager and the scheduler.
Not thread-safe: only the engine thread (``Engine``) calls it, between or as steps.
A step is schedule -> build batch -> forward -> sample -> emit. An exception while sampling
or emitting one request's token (its sampling, detokenization, stop matching, tree insert or
pins) fails that request alone; one in scheduling or the forward pass, which no single
request can be blamed for, fails that step's requests. Either way the failed requests get
``Finished(reason=error, kind=internal)`` with a generic message naming their request id
(the exception goes to the log under that id, never to a client), their blocks are freed,
nothing of theirs is inserted, and the engine keeps serving.

Breakpoint pins stay within the tenant's pin share and the pin ceiling (``pin_shares``).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from radixgate.kv import BlockPool, RadixTree, make_policy
from radixgate.kv.core.events import EventFanout, EventSink
from radixgate.kv.groups.window_plan import min_window_blocks, split_for_count
from radixgate.kv.manager import KVManager
from radixgate.kv.page_rounded import PageRoundedKVManager
from radixgate.kv.tiers.base import spill_to
from radixgate.kv.tiers.disk.glue import open_tier
from radixgate.kv.tiers.disk.records import FORMAT_VERSION
from radixgate.runtime.model.batch import build_forward_batch
from radixgate.runtime.model.fingerprint import model_fingerprint
from radixgate.runtime.model.kv_cache import KVCache, resolve_kv_dtype

from .api import ErrorKind, FinishReason, Request
from .detokenize import IncrementalDetokenizer, token_bytes_function
from .engine_config import EngineConfig
from .output import (EndCause, account_admission, account_pins, append_token, finished_event,
                     flush_text)
from .pin_shares import log_pin_shares, pin_ceiling, pin_share, pinned_prefix
from .sampling import TokenCounts, make_generator, sample_tokens, token_logprobs, top2_gaps
from .scheduler import Chunk, Scheduler
from .sequence import LogitsRecord, OutputState, Sequence, SeqStatus
from .spec import NamespaceDrafts
from .snapshot import EngineCounters, EngineShape, take_snapshot
from .stop import StopMatcher
from .grammar_masks import MaskWorker, append_constrained
from .submit_checks import SubmitLimits, SubmitView, rejection
from .trace import RequestTrace

log = logging.getLogger(__name__)

MAX_TRACES = 512   # record_logits keeps the traces of this many finished requests


class InjectedFault(RuntimeError):
    """Raised inside a step by ``Engine.inject_fault`` (reliability tests)."""


def resolve_deterministic(model, asked: bool | None) -> bool:
    """The deterministic mode's setting: ``asked`` True needs it (ValueError where the model
    or CPU cannot give it), False turns it off, None (the default) takes it where it holds.
    One log line says which guarantee the server gives."""
    if asked is False:
        log.info("deterministic mode off: a position's logits may depend on its batch")
        return False
    try:
        model.check_deterministic()
    except ValueError as e:
        if asked:
            raise
        log.warning("deterministic mode unavailable (%s): a position's logits may depend on "
                    "its batch", e)
        return False
    log.info("deterministic mode on: a position's logits are the same bits however it is "
             "scheduled (on this CPU kind and torch build)")
    return True


class EngineCore:
    def __init__(self, loaded, config: EngineConfig, wake: Callable[[], None] | None = None):
        """``wake``: called on the lower tier's reader thread when a load finished (the
        engine thread looks again); it must not block."""
        self.config = config
        self.model = loaded.model
        self.deterministic = resolve_deterministic(self.model, config.deterministic)
        self.tokenizer = loaded.tokenizer
        self.kv = _make_kv_cache(loaded, config, self.deterministic)
        cache = config.cache
        window = self.kv.window
        self.pool = BlockPool(self.kv.num_blocks, cache.block_size,
                              on_free=window.on_main_free if window is not None else None)
        self.tier = open_tier(config, self.kv,
                              lambda: model_fingerprint(loaded, self.kv, FORMAT_VERSION),
                              loaded.name, wake=wake)
        self.events = EventFanout()     # the tree's events: the drafts' index, KV events
        self.tree = RadixTree(self.pool, policy=make_policy(cache), spill=spill_to(self.tier),
                              on_event=self.events)
        manager = PageRoundedKVManager if cache.page_rounded_match else KVManager
        self.blocks = manager(self.tree, self.pool, self.kv,
                              enable_prefix_cache=cache.enable_prefix_cache, tier=self.tier)
        self.scheduler = Scheduler(config, self.blocks)
        self.spec_store = None
        if config.spec.enabled and config.spec.namespace_tokens > 0 and cache.enable_prefix_cache:
            self.spec_store = NamespaceDrafts(config.spec, cache.block_size)
            self.events.subscribe(self.spec_store.on_event)      # in step with the tree
        self.scheduler.shared_drafts = self.spec_store
        self.max_model_len = min(config.max_model_len or loaded.max_model_len, loaded.max_model_len)
        self.eos_ids = set(loaded.tokenizer.eos_token_ids) | set(loaded.config.eos_token_ids)
        self.vocab_size = loaded.config.vocab_size
        self._token_bytes = token_bytes_function(loaded.tokenizer)
        self._token_bytes(0)   # builds the tokenizer's byte table now, not in a first request
        self.grammar_masks = MaskWorker(self.vocab_size, self.kv.device)   # constrained rows' masks
        self.sequences: dict[str, Sequence] = {}
        self.counters = EngineCounters()
        self.traces: dict[str, RequestTrace] = {}
        self.faults: set[str] = set()     # request ids, or "*" for the next step
        self.draining = False
        self._arrivals = 0
        self.pin_ceiling = pin_ceiling(config, self.pool.num_blocks, self.pool.block_size)
        log_pin_shares(config, self.pin_ceiling)
        self.submit_view = self._submit_view()

    def subscribe_events(self, sink: EventSink) -> None:
        """``sink`` gets every ``CacheEvent`` of the tree (and of the window pool) from now
        on, after the earlier subscribers (the drafts' index), on the engine thread: call it
        before that thread starts. It must not block or touch the tree."""
        self.events.subscribe(sink)

    # -- requests -------------------------------------------------------------------------
    def add_request(self, request: Request, sink) -> None:
        problem = rejection(self.submit_view, request)
        if problem is not None:
            kind, message = problem
            seq = self._new_sequence(request, sink)
            self._emit_finished(seq, EndCause(FinishReason.ERROR, kind=kind, message=message))
            return
        seq = self._new_sequence(request, sink)
        self.sequences[request.request_id] = seq
        self.tree.open_namespace(request.namespace, request.tenant,
                                 self.config.quota_for(request.tenant).max_namespaces)
        self.scheduler.add(seq)

    def _submit_view(self) -> SubmitView:
        """What the checks at submission read (``submit_checks``): the fixed limits and the
        live state, through functions called on the engine thread."""
        limits = SubmitLimits(vocab_size=self.vocab_size, context_len=self.max_model_len,
                              block_size=self.pool.block_size, num_blocks=self.pool.num_blocks,
                              max_queue=self.config.max_queue)
        scheduler, quota_for = self.scheduler, self.config.quota_for
        return SubmitView(limits, draining=self.is_draining, in_use=self.sequences.__contains__,
                          pinned_blocks=self.tree.pinned_block_count,
                          waiting=lambda: scheduler.num_waiting, waiting_of=scheduler.waiting_of,
                          queue_quota=lambda tenant: quota_for(tenant).max_queued)

    def is_draining(self) -> bool:
        """The engine is shutting down and admits no new requests."""
        return self.draining

    def stop_admitting(self) -> None:
        """From now on every new request is refused (OVERLOADED): the engine drains."""
        self.draining = True

    def _new_sequence(self, request: Request, sink) -> Sequence:
        self._arrivals += 1
        params = request.sampling
        output = OutputState(StopMatcher(params.stop, request.stop_automaton),
                             IncrementalDetokenizer(self._token_bytes))
        return Sequence(request, arrival=self._arrivals, sink=sink,
                        generator=make_generator(params), output=output,
                        logits=LogitsRecord() if self.config.record_logits else None)

    def abort(self, request_id: str, finish: EndCause | None = None) -> bool:
        seq = self.sequences.get(request_id)
        if seq is None:
            return False
        self.finish(seq, finish or EndCause(FinishReason.ABORTED))
        return True

    def abort_all(self, finish: EndCause) -> None:
        for seq in list(self.sequences.values()):
            self.finish(seq, finish)

    def expire_deadlines(self, now: float) -> None:
        for seq in list(self.sequences.values()):
            deadline = seq.request.deadline
            if deadline is not None and now >= deadline:
                self.finish(seq, EndCause(FinishReason.ERROR, kind=ErrorKind.TIMEOUT,
                                          message="the request's deadline passed"))

    def finish(self, seq: Sequence, finish: EndCause, cache: bool = True) -> None:
        """Ends seq: sends the held-back text, caches what it computed (unless ``cache`` is
        False: after a failed step its K/V may be garbage), releases its blocks and lock,
        sends Finished."""
        if seq.status is SeqStatus.FINISHED:
            return
        if finish.reason is not FinishReason.ERROR:
            flush_text(seq)
        was_running = seq.status is SeqStatus.RUNNING
        self.scheduler.remove(seq)
        if was_running:
            self.blocks.release(seq, cache=cache)
        self._forget(seq)
        if seq.logits is not None:
            self.traces[seq.request_id] = seq.logits.trace()
            while len(self.traces) > MAX_TRACES:
                self.traces.pop(next(iter(self.traces)))
        self._emit_finished(seq, finish)

    def _forget(self, seq: Sequence) -> bool:
        """Drop seq from the live sequences and close its namespace (opened by
        ``add_request``: an unused one is dropped); False when it was gone already."""
        if self.sequences.pop(seq.request_id, None) is None:
            return False
        self.tree.close_namespace(seq.namespace)
        return True

    def _emit_finished(self, seq: Sequence, finish: EndCause) -> None:
        self.counters.finished += 1
        self.counters.errors += finish.reason is FinishReason.ERROR
        seq.status = SeqStatus.FINISHED
        seq.sink.put(finished_event(seq, finish))

    # -- one step -------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> bool:
        """Runs one step. False when it did nothing at all (``StepPlan.stalled``: nothing
        to compute, nothing finished, failed or was preempted), so that a next step does
        nothing either until a command arrives or the clock passes ``next_wake()``."""
        started = time.perf_counter()
        chunks: list[Chunk] = []
        prefill = 0
        try:
            plan = self.scheduler.schedule()
            self.counters.preemptions += len(plan.preempted)
            for seq, exc in plan.failed:
                self._fail_sequence(seq, exc)
            if plan.unfit is not None:
                self.finish(plan.unfit, EndCause(FinishReason.ERROR, kind=ErrorKind.TOO_LONG,
                                                 message=unfit_message(self, plan.unfit)))
            chunks = plan.chunks
            if not chunks:
                return not plan.stalled
            prefill = sum(c.num_tokens for c in chunks if not c.seq.kv.prefill_inserted)
            self._run(chunks)
        except Exception as exc:  # noqa: BLE001 - isolate the failure to this step's requests
            self._fail_step(chunks or list(self.scheduler.running), exc)
            prefill = 0
        elapsed = time.perf_counter() - started
        self.counters.steps += 1
        self.counters.step_s += elapsed
        self.counters.record_prefill(prefill, _prefill_share(elapsed, prefill, chunks))
        return True

    def next_wake(self) -> float | None:
        """The soonest ``time.monotonic()`` at which the clock alone changes what a step
        can do: a request's deadline passes, or an unexpired pin expires (its path turns
        evictable). None when only a command can (an abort, flush, unpin, new request).
        Costs one pass over the live requests and the pins (both bounded by quotas)."""
        deadlines = [seq.request.deadline for seq in self.sequences.values()
                     if seq.request.deadline is not None]
        now = self.tree.clock()
        expiries = [node.pin.expiry for node in self.tree.pinned_nodes
                    if node.pin is not None and node.pin.expiry > now]
        return min(deadlines + expiries, default=None)

    def _fail_step(self, chunks_or_seqs, exc: Exception) -> None:
        """Scheduling or the forward pass raised: no one request can be blamed, so every
        request of the step fails."""
        seqs = [item.seq if isinstance(item, Chunk) else item for item in chunks_or_seqs]
        log.error("step failed (requests %s): %r", ", ".join(s.request_id for s in seqs), exc,
                  exc_info=not isinstance(exc, InjectedFault))
        for seq in seqs:
            self._fail_sequence(seq, exc, logged=True)

    def _fail_sequence(self, seq: Sequence, exc: Exception, logged: bool = False) -> None:
        """Ends seq alone with a generic internal error; its K/V is not cached. The
        exception is logged with seq's request id and never reaches the client."""
        if not logged:
            log.error("request %s failed: %r", seq.request_id, exc, exc_info=exc)
        finish = EndCause(FinishReason.ERROR, kind=ErrorKind.INTERNAL,
                          message=internal_error_message(seq.request_id))
        try:
            self.finish(seq, finish, cache=False)
        except Exception:  # noqa: BLE001 - still end seq below
            log.error("request %s: cleanup after its failure raised", seq.request_id, exc_info=True)
        if self._forget(seq):                                      # finish() stopped half-way
            if seq.kv.block_table or seq.kv.lock_handle is not None:
                self.blocks.release(seq, cache=False)
            self._emit_finished(seq, finish)

    def _run(self, chunks: list[Chunk]) -> None:
        """Forward the step's chunks, then sample and emit per request. When a forward of
        several chunks raises, each is run again alone, so only a request whose own forward
        fails is failed (its slots are rewritten by the retry: store_kv runs first)."""
        for chunk in chunks:
            account_admission(chunk.seq)
        try:
            self._forward_and_emit(chunks)
        except Exception as exc:  # noqa: BLE001 - one request must not fail its batch
            if len(chunks) == 1:
                raise
            log.warning("a step of %d requests failed (%r): running them one by one",
                        len(chunks), exc)
            for chunk in chunks:
                try:
                    self._forward_and_emit([chunk])
                except Exception as exc_alone:  # noqa: BLE001 - this request's own failure
                    self._fail_sequence(chunk.seq, exc_alone)
        finally:
            self._consume_faults(chunks)

    def _forward_and_emit(self, chunks: list[Chunk]) -> None:
        self._maybe_inject_fault(chunks)
        sampling = [chunk.samples for chunk in chunks]
        rows = [_logits_rows(c, s) for c, s in zip(chunks, sampling)]
        batch = build_forward_batch(
            [c.seq.tokens[c.seq.num_computed:c.seq.num_computed + c.num_tokens] + list(c.drafts)
             for c in chunks],
            [c.seq.num_computed for c in chunks], [c.seq.kv.block_table for c in chunks],
            self.pool.block_size, self.kv.device, logits_rows=rows,
            deterministic=self.deterministic)
        plain = [i for i, (c, s) in enumerate(zip(chunks, sampling)) if s and not c.drafts]
        sampled = [chunks[i].seq for i in plain]      # one row each; drafted chunks verify
        pending = self.grammar_masks.start(sampled)  # computed while the forward runs
        forward_started = time.perf_counter()
        try:
            logits = self.model.forward(batch, self.kv)  # [rows wanted, V]
            # read before num_computed moves: a failed mask fill leaves the step retryable
            masks = pending.result() if pending is not None else None
        except BaseException:
            if pending is not None:
                pending.wait()      # the worker is done with the grammars before any retry
            raise
        forward_s = time.perf_counter() - forward_started
        logits = self._record_prompt_logprobs(chunks, sampling, rows, logits)
        self.counters.forward_s += forward_s
        for chunk in chunks:
            chunk.seq.num_computed += chunk.num_tokens
        starts = _sampling_row_starts(chunks, sampling)
        if plain:
            self._sample_and_emit(sampled, logits[[starts[i] for i in plain]], masks)
        for i, chunk in enumerate(chunks):
            if chunk.drafts:
                self._verify_drafts(chunk.seq, chunk.drafts,
                                    logits[starts[i]:starts[i] + 1 + len(chunk.drafts)])

    def _verify_drafts(self, seq: Sequence, drafts: tuple[int, ...], logits: torch.Tensor) -> None:
        """Row i of ``logits`` follows the last sampled token and drafts[:i]: each row is
        sampled as a decode step samples it, in order, and the drafts are kept while the
        sampled token equals the draft (radixgate/runtime/engine/spec.py: exact for greedy rows, the
        model's distribution for sampled ones). A kept draft's K/V is computed already."""
        accepted = 0
        for i in range(len(drafts) + 1):
            before = len(seq.tokens)
            pending = self.grammar_masks.start([seq])        # the state after drafts[:i]
            self._sample_and_emit([seq], logits[i:i + 1],
                                  pending.result() if pending is not None else None)
            if seq.status is not SeqStatus.RUNNING or len(seq.tokens) != before + 1:
                break
            if i == len(drafts) or seq.tokens[-1] != drafts[i]:
                break
            seq.num_computed += 1
            accepted += 1
        if seq.drafter is not None:
            seq.drafter.record(len(drafts), accepted)
        self.counters.record_spec(len(drafts), accepted)

    def _record_prompt_logprobs(self, chunks, sampling, rows, logits: torch.Tensor):
        """Prompt-logprob chunks asked for a row per new token: the log probability of each
        next prompt token goes to the sequence; returns the sampling rows only
        [num sampling chunks, V]."""
        if not any(_computes_prompt_logprobs(c.seq) for c in chunks):
            return logits
        keep, start = [], 0
        for chunk, wanted, samples in zip(chunks, rows, sampling):
            seq = chunk.seq
            if _computes_prompt_logprobs(seq):
                # row r predicts position num_computed + r + 1; positions recorded before a
                # preemption (its prompt is computed again) are not recorded twice
                recorded = seq.output.prompt_logprobs
                skip = max(0, len(recorded) - seq.num_computed - 1)
                first = seq.num_computed + 1 + skip
                nexts = seq.tokens[first:min(seq.num_computed + 1 + len(wanted), seq.num_prompt)]
                block = logits[start + skip:start + skip + len(nexts)]
                recorded.extend(token_logprobs(
                    block, [seq.params.prompt_logprobs] * len(nexts), list(nexts)))
            if samples:
                keep.extend(range(start + len(wanted) - 1 - len(chunk.drafts),
                                  start + len(wanted)))
            start += len(wanted)
        return logits[keep]

    def _sample_and_emit(self, seqs: list[Sequence], logits: torch.Tensor, masks=None) -> None:
        """One token per sequence (logits: [len(seqs), V]; ``masks``: the constrained rows'
        ``TokenMasks``); an exception while sampling or emitting a sequence's token fails
        that sequence alone."""
        tokens = self._sample(seqs, logits, masks)
        if self.config.record_logits:
            for seq, gap, row in zip(seqs, top2_gaps(logits), logits):
                seq.logits.gaps.append(gap)
                seq.logits.rows.append(row.detach().cpu().clone())
        logprobs = token_logprobs(logits, [s.params.logprobs for s in seqs], tokens)
        for seq, token, logprob in zip(seqs, tokens, logprobs):
            if token is None:
                continue
            try:
                self._emit_token(seq, token, logprob)
            except Exception as exc:  # noqa: BLE001 - isolate the failure to this request
                self._fail_sequence(seq, exc)

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor, masks=None) -> list[int | None]:
        """Samples the batch at once; if that raises, row by row, where a row that raises
        fails its sequence (None in its place). A retried row may draw again from its
        generator: seeded reproducibility is kept only when nothing fails."""
        for seq in seqs:
            if seq.token_counts is None:
                seq.token_counts = TokenCounts(seq.tokens, seq.num_prompt)
        try:
            return sample_tokens(logits, [s.params for s in seqs], [s.generator for s in seqs],
                                 [s.token_counts for s in seqs], self.eos_ids, masks)
        except Exception:  # noqa: BLE001 - find the failing rows below
            pass
        tokens: list[int | None] = []
        for i, seq in enumerate(seqs):
            try:
                tokens.append(sample_tokens(logits[i:i + 1], [seq.params], [seq.generator],
                                            [seq.token_counts], self.eos_ids,
                                            masks.row(i) if masks else None)[0])
            except Exception as exc:  # noqa: BLE001
                self._fail_sequence(seq, exc)
                tokens.append(None)
        return tokens

    def _emit_token(self, seq: Sequence, token: int, logprob=None) -> None:
        if not seq.kv.prefill_inserted:
            self._on_prefilled(seq)
        if seq.grammar is None:
            finish = append_token(seq, token, self.eos_ids, self.max_model_len, logprob)
        else:
            finish = append_constrained(seq, token, self.eos_ids, self.max_model_len, logprob,
                                        self.config.jump_forward)
        if finish is not None:
            self.finish(seq, finish)

    def _on_prefilled(self, seq: Sequence) -> None:
        """The tokens present at admission are computed: cache them, move the lock to their
        node, pin the prompt's breakpoints (once)."""
        self.blocks.insert_prefilled(seq)
        seq.kv.prefill_inserted = True
        if not seq.pins_done:
            seq.pins_done = True
            self._pin_breakpoints(seq)

    def _pin_breakpoints(self, seq: Sequence) -> None:
        """Pins each breakpoint that fits the tenant's pin share and the pin ceiling, then
        bills creation for the pinned ones only (a skipped one is uncached input). A pin
        counts the tokens it adds to what the tenant has pinned on that path already."""
        pinned: list[tuple[int, float]] = []   # (pinned length, ttl_s)
        outcomes: list[tuple[int, str]] = []
        if self.config.cache.enable_prefix_cache:
            share = pin_share(self.config, self.pin_ceiling, seq.tenant)
            for point in seq.prompt_breakpoints():
                outcome = self._pin_one(seq, point, share, pinned)
                outcomes.append((point.offset, outcome))
        else:
            outcomes = [(point.offset, "no_cache") for point in seq.prompt_breakpoints()]
        account_pins(seq, pinned, tuple(outcomes))

    def _pin_one(self, seq: Sequence, point, share: int, pinned: list) -> str:
        """Pins one breakpoint when the tenant's share and the ceiling allow; its outcome."""
        prefix = seq.tokens[:point.offset]
        added = point.offset - pinned_prefix(self.tree, seq.namespace, prefix, seq.tenant)
        if self.tree.pinned_tokens(seq.tenant) + added > share:
            return "pin_quota"
        if self.tree.pinned_tokens() + added > self.pin_ceiling:
            return "pin_ceiling"
        length = self.blocks.pin(seq, point.offset, point.ttl_s)
        if length <= 0:
            return "not_cached"
        pinned.append((length, point.ttl_s))
        return "pinned"

    def _maybe_inject_fault(self, chunks: list[Chunk]) -> None:
        """Raises when a fault is set for the step ("*") or for one of its requests; the
        faults stay set through the step's retries (``_consume_faults`` ends them)."""
        if not self.faults:
            return
        hit = [c.seq.request_id for c in chunks if c.seq.request_id in self.faults]
        if "*" in self.faults or hit:
            raise InjectedFault(f"injected fault (requests {hit or 'of the next step'})")

    def _consume_faults(self, chunks: list[Chunk]) -> None:
        if self.faults:
            self.faults.discard("*")
            self.faults.difference_update(c.seq.request_id for c in chunks)

    # -- cache commands -------------------------------------------------------------------
    def flush(self, namespace: str | None = None) -> int:
        """Evicts every unlocked node of ``namespace`` (all when None) and purges its
        blocks from the lower tier too; returns the memory blocks freed."""
        freed = self.tree.flush(namespace)
        if self.tier is not None:
            self.tier.purge(namespace)
        return freed

    def holds_namespace(self, namespace: str) -> bool:
        """Whether ``namespace`` is live in the tree (content, locks or open requests) or
        has blocks in the lower tier: what a flush of it could reach."""
        return (self.tree.namespace(namespace) is not None
                or (self.tier is not None and self.tier.holds_namespace(namespace)))

    def evict(self, num_blocks: int) -> int:
        """Evicts up to ``num_blocks`` unlocked blocks as memory pressure would (into the
        lower tier, when there is one); returns the blocks freed."""
        return self.tree.evict(num_blocks)

    def pin_prefix(self, namespace: str, tokens: list[int], ttl_s: float, owner: str = "") -> int:
        """Pins the longest cached prefix of ``tokens`` (``KVManager.pin_prefix``)."""
        return self.blocks.pin_prefix(namespace, tokens, ttl_s, owner)

    def unpin_prefix(self, namespace: str, tokens: list[int]) -> bool:
        return self.blocks.unpin_prefix(namespace, tokens)

    def retire_namespace(self, namespace: str) -> int:
        """Drops ``namespace`` as its tenant's ``max_namespaces`` would (pins stay)."""
        return self.tree.retire_namespace(namespace)

    def expect_continuation(self, namespace: str, tokens: list[int]) -> int:
        """A request extending ``tokens`` is expected soon: their path outlives other
        leaves for a while; returns the cached length marked."""
        return self.tree.expect_continuation(namespace, tokens)

    def inject_fault(self, request_id: str) -> None:
        """The next step that includes ``request_id`` ("*": any next step) raises."""
        self.faults.add(request_id)

    def trace(self, request_id: str) -> RequestTrace | None:
        """The ``record_logits`` trace of a finished request (the last ``MAX_TRACES``)."""
        return self.traces.get(request_id)

    def record_stall(self) -> None:
        """Nothing could run: the engine thread waits for a command or the clock."""
        self.counters.stalls += 1

    def shape(self) -> EngineShape:
        """The engine's fixed sizes (they never change after construction)."""
        return EngineShape(block_size=self.pool.block_size, num_blocks=self.pool.num_blocks,
                           max_model_len=self.max_model_len, kv_dtype=self.kv.kv_dtype,
                           kv_bytes_per_token=self.kv.bytes_per_token)

    def close(self) -> None:
        """The engine stopped: the lower tier keeps what the tree holds, then closes."""
        if self.tier is not None:
            self.blocks.close()
            self.tier = None

    # -- reports --------------------------------------------------------------------------
    def snapshot(self):
        return take_snapshot(self.tree, self.pool, self.scheduler, self.counters,
                             top_n=self.config.top_prefixes, draining=self.draining,
                             kv_dtype=self.kv.kv_dtype, kv_bytes_per_token=self.kv.bytes_per_token,
                             tier=self.tier.stats() if self.tier is not None else None,
                             hit_tokens=self.blocks.hit_tokens, kv=self.kv,
                             window_pool=self.blocks.window_counts(self.scheduler.running))

    def check_integrity(self) -> dict:
        """The KV books recounted (``KVManager.check_integrity``: raises on a mismatch)
        against the running requests' block tables and every sequence's window holds."""
        return self.blocks.check_integrity(self.scheduler.running, self.scheduler.all_sequences())


def internal_error_message(request_id: str) -> str:
    """What a client sees of an internal failure (the details are in the log)."""
    return f"internal error while generating (request id {request_id})"


def unfit_message(core: EngineCore, seq: Sequence) -> str:
    """Why ``seq`` can never be scheduled, from its own numbers and the configured capacity."""
    return (f"the request (prompt {seq.num_prompt} tokens + max_tokens {seq.params.max_tokens})"
            f" does not fit the KV cache of {core.pool.num_blocks * core.pool.block_size} tokens"
            f" ({core.pool.num_blocks} blocks), part of which pinned prefixes may hold")


def _make_kv_cache(loaded, config: EngineConfig, deterministic: bool) -> KVCache:
    """The KV cache for ``config``: its main pool and, for a model with sliding-window
    layers, the window layers' own pool (radixgate/kv/groups/window_plan.py); ``auto``'s
    dtype depends on the mode (``resolve_kv_dtype``)."""
    mc, block_size = loaded.config, config.cache.block_size
    kv_dtype = resolve_kv_dtype(config.cache.kv_dtype, loaded.dtype, loaded.device,
                                deterministic)
    context = min(config.max_model_len or loaded.max_model_len, loaded.max_model_len)
    step = min(config.solo_budget, context)     # the most one sequence computes in a step
    sizing = dict(context=context, step_tokens=step, window_ratio=config.cache.window_ratio)
    if config.num_blocks is not None:
        split = split_for_count(config.num_blocks, mc.layer_windows, block_size=block_size,
                                context=context, step_tokens=step,
                                ratio=config.cache.window_ratio,
                                window_blocks=config.window_blocks)
        kv = KVCache(mc.num_layers, config.num_blocks, block_size, mc.num_kv_heads,
                     mc.head_dim, kv_dtype, loaded.device, split)
    else:
        kv = KVCache.from_budget(mc, config.cache.kv_cache_bytes, block_size, kv_dtype,
                                 loaded.device, **sizing)
    if kv.window is not None:
        least = min_window_blocks(kv.window.window, step, block_size)
        if kv.num_window_blocks < least:
            raise ValueError(f"the window layers' pool of {kv.num_window_blocks} blocks is "
                             f"smaller than one sequence's window and step ({least} blocks)")
    log.info("KV cache (%s): %d bytes per token, %d blocks of %d = %d tokens fit%s", kv.kv_dtype,
             kv.bytes_per_token, kv.num_blocks, kv.block_size, kv.num_tokens,
             f"; window layers {sorted(kv.window_layers)}: {kv.num_window_blocks} blocks "
             f"(W={kv.window.window})" if kv.window is not None else "")
    return kv


def _computes_prompt_logprobs(seq: Sequence) -> bool:
    """seq asked for prompt logprobs and is computing its prompt (before this step's
    ``num_computed`` update)."""
    return seq.params.prompt_logprobs is not None and seq.num_computed < seq.num_prompt


def _prefill_share(step_s: float, prefill_tokens: int, chunks: list[Chunk]) -> float:
    """The part of a step's time spent on its prompt tokens (what the prefill rate counts:
    scheduling, the forward and inserting into the tree, as a cached prompt saves them all);
    shared out by tokens when decode rows (and drafts) of other requests ran in the step."""
    computed = sum(c.num_tokens + len(c.drafts) for c in chunks)
    return step_s * prefill_tokens / computed if computed else 0.0


def _logits_rows(chunk: Chunk, samples: bool) -> list[int]:
    """Rows of ``chunk`` whose logits the step needs: the last one when it samples (and each
    draft's after it), every one while a prompt-logprobs request computes its prompt."""
    if _computes_prompt_logprobs(chunk.seq):
        return list(range(chunk.num_tokens + len(chunk.drafts)))
    if not samples:
        return []
    return list(range(chunk.num_tokens - 1, chunk.num_tokens + len(chunk.drafts)))


def _sampling_row_starts(chunks: list[Chunk], sampling: list[bool]) -> list[int]:
    """Where each sampling chunk's rows begin in the logits kept for sampling (one row,
    or one plus one per draft)."""
    starts, row = [], 0
    for chunk, samples in zip(chunks, sampling):
        starts.append(row)
        if samples:
            row += 1 + len(chunk.drafts)
    return starts

