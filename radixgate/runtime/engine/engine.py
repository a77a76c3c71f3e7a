"""Engine: one thread running the step loop, fed by a thread-safe command queue.

docs/ARCHITECTURE.md section 5. Every call that changes engine state (submit, abort, flush, pin,
unpin, publish, check_integrity, a fresh snapshot, fault injection, shutdown) is a command
applied between steps by the engine thread; only that thread touches the tree, the pool
and the KV tensors. Commands return ``concurrent.futures.Future``. When nothing runs or
waits, the thread blocks on the queue (no polling); when requests wait but none can start
(no room, a quota), it blocks on the queue until a command arrives or the clock passes the
next request deadline or pin expiry (``EngineCore.next_wake``), again without polling.
``snapshot()`` returns the latest immutable ``EngineSnapshot``, published between steps.

Usage::

    engine = Engine(load_model(tiny=True), EngineConfig(num_blocks=256)).start()
    async for event in engine.submit(request): ...     # inside an asyncio loop
    finished = engine.generate(request)                # blocking helper
    engine.shutdown(grace_s=5)
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import torch

from radixgate.kv import PUBLIC_NAMESPACE
from radixgate.runtime.model.fresh_thread import run_on_fresh_thread

from .api import Breakpoint, ErrorKind, Event, Finished, FinishReason, Request, SamplingParams, Usage
from .core import EngineCore
from .cpu_threads import ThreadGovernor
from .engine_config import EngineConfig
from .handle import SLOW_READER_MESSAGE, AsyncSink, RequestHandle
from .output import EndCause
from .snapshot import EngineSnapshot, empty_snapshot
from .trace import RequestTrace

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, loaded, config: EngineConfig):
        self.loaded = loaded
        self.config = config
        # built on a thread that ends with the build: a torch op of the build that goes
        # parallel (the tier fingerprint's embedding probe, a warm-up) would otherwise leave
        # the caller, often a long-lived executor thread, an OpenMP pool for the process's
        # life, and the engine's workers would sleep between ops (cpu_threads.py); the
        # lower tier's reader wakes the engine thread through the command queue (``_wake``)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self.core = run_on_fresh_thread(EngineCore, loaded, config, wake=self._wake)
        self.tokenizer = loaded.tokenizer
        self.model_info = loaded.info
        self.shape = shape = self.core.shape()
        self.block_size = shape.block_size
        self.num_blocks = shape.num_blocks
        self.max_model_len = shape.max_model_len
        self._state_lock = threading.Lock()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._drain_deadline: float | None = None
        self._snapshot = empty_snapshot(shape.num_blocks, shape.block_size, shape.kv_dtype,
                                        shape.kv_bytes_per_token)
        self._last_publish = 0.0
        self.kv_events = self._kv_event_publisher()

    def _kv_event_publisher(self):
        """The KV-event publisher fed by the tree (``config.kv_events_endpoint``), or None."""
        if self.config.kv_events_endpoint is None:
            return None
        from radixgate.kv.events.blocks import hash_seed
        from radixgate.kv.events.publisher import KVEventPublisher
        seed = hash_seed(getattr(self.loaded, "name", "model"), self.shape.kv_dtype,
                         self.block_size)
        publisher = KVEventPublisher(self.config.kv_events_endpoint, seed, self.block_size,
                                     rank=self.config.kv_events_rank,
                                     topic=self.config.kv_events_topic,
                                     allow_remote=self.config.kv_events_allow_remote,
                                     replay_endpoint=self.config.kv_events_replay_endpoint)
        self.core.subscribe_events(publisher.put)        # after the drafts' index, if any
        return publisher

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> "Engine":
        """Starts the engine thread with the caller's torch thread count (radixgate/runtime/engine/cpu_threads.py:
        it should be the process's only thread holding torch's worker threads)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, args=(torch.get_num_threads(),),
                                            name="radixgate-engine", daemon=True)
            self._thread.start()
        return self

    def shutdown(self, grace_s: float = 10.0) -> None:
        """Stops admitting (new requests get OVERLOADED), lets running and queued requests
        finish for up to ``grace_s`` seconds, aborts the rest, stops the thread."""
        if self._thread is None or not self._thread.is_alive():
            self._mark_stopped()
            if self._thread is None:
                self.core.close()
            if self.kv_events is not None and self._thread is None:
                self.kv_events.close()
            return
        self._command(self._begin_drain, time.monotonic() + grace_s)
        self._thread.join()

    def is_running(self) -> bool:
        """The engine thread is alive and admitting (not stopped or stopping)."""
        with self._state_lock:
            stopped = self._stopped
        return not stopped and self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown(grace_s=0)

    # -- requests -------------------------------------------------------------------------
    def submit(self, request: Request) -> RequestHandle:
        """Queues a request; call from a running asyncio loop. Its events arrive on the
        returned handle (TextDelta..., then one Finished). Never raises for a bad request:
        the handle yields a Finished with reason error instead."""
        limit = self.config.max_unsent_events
        sink = AsyncSink(asyncio.get_running_loop(), limit,
                         lambda: self._stop_slow_reader(request.request_id, limit))
        self._enqueue_request(request, sink)
        return RequestHandle(request.request_id, sink, self.abort)

    def _stop_slow_reader(self, request_id: str, limit: int) -> None:
        """The request's reader left ``limit`` events unread: end it (its blocks go back)."""
        message = SLOW_READER_MESSAGE.format(limit=limit)
        self._command(self.core.abort, request_id,
                      EndCause(FinishReason.ERROR, kind=ErrorKind.TIMEOUT, message=message))

    def generate(self, request: Request, on_event: Callable[[Event], None] | None = None,
                 timeout: float | None = None) -> Finished:
        """Blocking submit: returns the Finished event (``on_event`` sees every event on the
        engine thread as it is produced). After ``timeout`` seconds the request is aborted."""
        future = self.submit_future(request, on_event)
        try:
            return future.result(timeout)
        except TimeoutError:
            self.abort(request.request_id).result()
            return future.result()

    def submit_future(self, request: Request,
                      on_event: Callable[[Event], None] | None = None) -> Future:
        """Thread-safe submit without an event loop: Future[Finished]. The request is queued
        before this returns (requests submitted in a row are seen in that order)."""
        future: Future = Future()

        def deliver(event: Event) -> None:
            if on_event is not None:
                on_event(event)
            if isinstance(event, Finished):
                future.set_result(event)

        self._enqueue_request(request, _CallbackSink(deliver))
        return future

    def abort(self, request_id: str) -> Future:
        """Future[bool]: True when the request was still running or waiting."""
        return self._command(self.core.abort, request_id)

    def _enqueue_request(self, request: Request, sink) -> None:
        with self._state_lock:
            if not self._stopped:
                self._commands.put((self.core.add_request, (request, sink), None))
                return
        sink.put(_rejected(request, ErrorKind.OVERLOADED, "the engine is not running"))

    # -- commands -------------------------------------------------------------------------
    def flush(self, namespace: str | None = None) -> Future:
        """Future[int]: evicts every unlocked node (pins included) and purges the lower
        tier's blocks of ``namespace`` (all when None); returns freed memory blocks."""
        return self._command(self.core.flush, namespace)

    def holds_namespace(self, namespace: str) -> Future:
        """Future[bool]: whether the cache (either tier) holds anything of ``namespace``."""
        return self._command(self.core.holds_namespace, namespace)

    def evict(self, num_blocks: int) -> Future:
        """Future[int]: evicts up to ``num_blocks`` unlocked blocks as memory pressure
        would (into the lower tier, when there is one); returns the blocks freed."""
        return self._command(self.core.evict, num_blocks)

    def pin(self, namespace: str, tokens: Sequence[int], ttl_s: float, owner: str = "") -> Future:
        """Future[int]: pins the longest cached prefix of tokens; returns the pinned length
        (with a disk tier: kept there for ``ttl_s``, in memory at most an hour)."""
        return self._command(self.core.pin_prefix, namespace, list(tokens), ttl_s, owner)

    def retire_namespace(self, namespace: str) -> Future:
        """Future[int]: ``namespace`` goes as its tenant's ``max_namespaces`` would drop it
        (``RadixTree.retire_namespace``; pinned paths stay); returns the blocks freed."""
        return self._command(self.core.retire_namespace, namespace)

    def expect_continuation(self, namespace: str, tokens: Sequence[int]) -> Future:
        """Future[int]: a request extending ``tokens`` is expected soon (the response ends
        in a tool call); their cached path outlives other leaves for a while
        (``EvictionPolicy.continuation_ticks``). Returns the cached length marked."""
        return self._command(self.core.expect_continuation, namespace, list(tokens))

    def unpin(self, namespace: str, tokens: Sequence[int]) -> Future:
        return self._command(self.core.unpin_prefix, namespace, list(tokens))

    def publish(self, tokens: Sequence[int], ttl_s: float, namespace: str = PUBLIC_NAMESPACE,
                owner: str = PUBLIC_NAMESPACE) -> Future:
        """Future[Finished]: computes ``tokens`` into ``namespace`` (default ``public``:
        tenants with ``use_public`` then reuse them) and pins them for ``ttl_s``, booked to
        ``owner`` (the tenant whose namespace it is)."""
        request = Request(list(tokens), SamplingParams(max_tokens=1, temperature=0.0),
                          tenant=owner, namespace=namespace,
                          breakpoints=(Breakpoint(len(tokens), ttl_s),))
        return self.submit_future(request)

    def check_integrity(self) -> Future:
        """Future[dict]: recounts tree and pool (IntegrityError/AssertionError on mismatch)."""
        return self._command(self.core.check_integrity)

    def inject_fault(self, request_id: str | None = None) -> Future:
        """The next step that includes ``request_id`` (any next step when None) raises."""
        return self._command(self.core.inject_fault, request_id or "*")

    def request_snapshot(self) -> Future:
        """Future[EngineSnapshot] taken now (between steps), also published."""
        return self._command(self._publish)

    def snapshot(self) -> EngineSnapshot:
        """The latest published snapshot (never blocks)."""
        return self._snapshot

    def debug_trace(self, request_id: str) -> RequestTrace | None:
        """Per-step top-2 gaps and logits of a finished request (``record_logits`` only)."""
        return self.core.trace(request_id)

    def _wake(self) -> None:
        """A tier load finished (the tier's reader thread): the engine thread looks again."""
        self._commands.put((_nothing, (), None))

    def _command(self, fn: Callable, *args) -> Future:
        future: Future = Future()
        with self._state_lock:
            if not self._stopped:
                self._commands.put((fn, args, future))
                return future
        future.set_exception(RuntimeError("the engine is not running"))
        return future

    # -- the engine thread ----------------------------------------------------------------
    def _run(self, threads: int) -> None:
        torch.set_num_threads(threads)
        core = self.core
        self.thread_governor = governor = ThreadGovernor(threads, adapt=self.config.adapt_threads)
        try:
            while True:
                draining = self._drain_deadline is not None
                self._apply_commands(block=not core.has_work() and not draining)
                if self._drain_deadline is not None and self._drain_done():
                    break
                core.expire_deadlines(time.monotonic())
                if not core.has_work():
                    self._on_idle()
                    continue
                governor.tick()
                if not core.step():
                    self._wait_for_change()
                self._maybe_publish()
        finally:
            self._stop_thread()

    def _wait_for_change(self) -> None:
        """Waiting requests cannot start and nothing runs: only a command (abort, flush,
        unpin, a new request...), a deadline, a pin's expiry or the drain deadline can
        change that. Blocks on the command queue until the soonest of them."""
        self.core.record_stall()
        self._publish()
        wakes = [t for t in (self.core.next_wake(), self._drain_deadline) if t is not None]
        timeout = max(0.0, min(wakes) - time.monotonic()) if wakes else None
        self._apply_commands(block=True, timeout=timeout)

    def _apply_commands(self, block: bool, timeout: float | None = None) -> None:
        try:
            item = self._commands.get(timeout=timeout) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(*item)
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return

    @staticmethod
    def _apply(fn: Callable, args: tuple, future: Future | None) -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - the caller receives it
            if future is None:
                log.exception("engine command %s failed", getattr(fn, "__name__", fn))
            else:
                future.set_exception(exc)
            return
        if future is not None:
            future.set_result(result)

    def _on_idle(self) -> None:
        self._publish()
        if self.config.debug_integrity:
            try:
                self.core.check_integrity()
            except AssertionError:
                log.exception("integrity check failed while idle")

    def _publish(self) -> EngineSnapshot:
        self._snapshot = self.core.snapshot()
        self._last_publish = time.monotonic()
        return self._snapshot

    def _maybe_publish(self) -> None:
        if time.monotonic() - self._last_publish >= self.config.snapshot_interval_s:
            self._publish()

    def _begin_drain(self, deadline: float) -> None:
        self.core.stop_admitting()
        self._drain_deadline = deadline

    def _drain_done(self) -> bool:
        if not self.core.has_work():
            return True
        if time.monotonic() >= self._drain_deadline:
            self.core.abort_all(EndCause(FinishReason.ABORTED, message="the engine shut down"))
            return True
        return False

    def _stop_thread(self) -> None:
        self._mark_stopped()
        self.core.stop_admitting()
        self.core.abort_all(EndCause(FinishReason.ABORTED, message="the engine shut down"))
        self._apply_commands(block=False)   # late commands: requests get OVERLOADED
        try:
            self.core.close()
        except Exception:  # noqa: BLE001 - stopping goes on
            log.exception("closing the KV tier failed")
        self._publish()
        if self.kv_events is not None:
            self.kv_events.close()

    def _mark_stopped(self) -> None:
        with self._state_lock:
            self._stopped = True


def _nothing() -> None:
    pass


class _CallbackSink:
    def __init__(self, deliver: Callable[[Event], None]):
        self.put = deliver


def _rejected(request: Request, kind: ErrorKind, message: str) -> Finished:
    return Finished(FinishReason.ERROR, Usage(prompt_tokens=len(request.tokens),
                                              uncached_tokens=len(request.tokens)),
                    error_kind=kind, error_message=message, request_id=request.request_id)
