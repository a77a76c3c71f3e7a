"""``ClusterEngine``: the gateway's engine when the engines are Ray Serve replicas.

It implements ``runtime.engine.client.EngineClient``, the contract of the in-process
``Engine`` too, so the HTTP layer is the same for one engine and for N. It runs no model:
``model_info`` (tokenizer, name, vocabulary, context) is read from the model's config and
tokenizer alone (``runtime.model.loader.read_model_info``).

- **Routing**: every request goes through the deployment handle, whose router
  (``serve_router.py``) picks the replica. Admin commands go to every replica
  (``target=``); their results are combined (freed blocks summed, pinned length max).
- **Tenants, once**: a tenant's ``max_running`` / ``max_queued`` and the server's
  ``max_queue`` are enforced here for the whole deployment (``admission.py``); the replicas
  run without those quotas. Pins: a request's breakpoints are reserved against the
  tenant's ``max_pinned_tokens`` across the replicas before it is sent (those that do not
  fit are dropped, as one engine skips pins beyond the share); ``max_namespaces`` is counted
  over the deployment too, its retired namespaces dropped on every replica (admission.py).
- **Faults**: a request whose replica dies before the first event is sent to another
  replica (up to ``MAX_ATTEMPTS`` tries, pausing 0.2, 0.4, ... s): each retry excludes the
  replicas that died under it (the router says where each try went), which Serve may still
  list for a moment; one that had started streaming ends with an ``internal`` error event.
  Ray Serve restarts the replica.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from concurrent.futures import Future

from radixgate.kv import PUBLIC_NAMESPACE
from radixgate.runtime.engine.api import (EngineUnavailable, ErrorKind, Finished, FinishReason,
                                         Request, Usage)

from .admission import TenantAdmission
from .snapshot_merge import merge_snapshots

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 5
RETRY_PAUSE_S = 0.2            # doubled after each failed try (Serve needs a moment to drop a dead replica)
REPLICA_FAILED = "the engine replica serving this request failed; retry the request"
BROADCAST_PRESENCE_CHECK_S = 1.0   # how often a waiting per-replica call checks its replica is still there
SNAPSHOT_DEADLINE_S = 10.0     # a replica answers between steps; past this its last report is used
COMMAND_DEADLINE_S = 60.0      # a command (flush, pin, ...) one replica has not answered by then fails
PUBLISH_DEADLINE_S = 300.0     # publish computes the prefix, behind the replica's queue


class ClusterEngine:
    def __init__(self, handle, model_info, engine_config, *, started_ray: bool = True):
        self.handle = handle
        self.model_info = model_info
        self.tokenizer = model_info.tokenizer
        self.config = engine_config
        self.block_size = engine_config.cache.block_size
        self.max_model_len = min(engine_config.max_model_len or model_info.max_model_len,
                                 model_info.max_model_len)
        self.num_blocks = 0                  # per replica: learned from the first stats
        self.admission = TenantAdmission(engine_config, retire=self.retire_namespace)
        self.started_ray = started_ray
        self.replica_usage: dict[str, list[int]] = {}    # replica -> [cached, prompt]
        self.fresh: dict[str, object] = {}              # replica -> last requested snapshot
        self.stale: set[str] = set()        # replicas that missed the last snapshot request
        self._latest = merge_snapshots({}, {}, {}, self.block_size)
        self._stopped = False

    # -- requests -------------------------------------------------------------------------
    def submit(self, request: Request) -> "ClusterHandle":
        return ClusterHandle(self, self._within_pin_share(request))

    def _within_pin_share(self, request: Request) -> Request:
        if not request.breakpoints:
            return request
        return self.admission.pins.admit(request, self._router_stats())

    def book(self, replica: str, finished: Finished) -> None:
        if finished.usage is None:
            return
        booked = self.replica_usage.setdefault(replica, [0, 0])
        booked[0] += finished.usage.cache_read_tokens
        booked[1] += finished.usage.prompt_tokens

    # -- stats ----------------------------------------------------------------------------
    def snapshot(self):
        """Every replica's latest snapshot (reported with its routing stats, at most
        ``serve_app.STATS_PERIOD_S`` old, or the last one requested), summed."""
        stats = self._router_stats()
        snapshots = {}
        for s in stats:
            name = s["replica"]
            snap = s.get("snapshot") or self.fresh.get(name)
            fresher = self.fresh.get(name)
            if fresher is not None and (snap is None or fresher.time > snap.time):
                snap = fresher
            if snap is not None:
                snapshots[name] = snap
        if snapshots:
            self.num_blocks = min(s.blocks.total for s in snapshots.values())
            self._latest = merge_snapshots(snapshots, self.hit_rates(),
                                           {s["replica"]: dict(s, stale=s["replica"] in self.stale)
                                            for s in stats}, self.block_size)
        return self._latest

    def learn_block_count(self, timeout_s: float = SNAPSHOT_DEADLINE_S) -> None:
        """``num_blocks`` from one replica's snapshot (every replica has the same KV budget),
        so the start's log says what a replica holds; left 0 (learned from the first stats)
        when none answers in time. Called once the deployment is up, off the event loop."""
        try:
            _, snap = self.handle.call.remote("request_snapshot").result(timeout_s=timeout_s)
        except Exception as e:  # noqa: BLE001 - a count for the log, never a failed start
            log.warning("no replica reported its KV blocks within %g s: %s", timeout_s, e)
            return
        self.num_blocks = snap.blocks.total

    def request_done(self, replica: str, request_id: str) -> None:
        from .registry import routers
        for router in routers():
            router.request_done(replica, request_id)

    def take_placement(self, request_id: str) -> str | None:
        """The replica the router sent the last try of ``request_id`` to (None: unknown)."""
        from .registry import routers
        for router in routers():
            placed = router.take_placement(request_id)
            if placed is not None:
                return placed
        return None

    def hit_rates(self) -> dict[str, float]:
        return {name: cached / prompt for name, (cached, prompt) in self.replica_usage.items()
                if prompt}

    def request_snapshot(self) -> Future:
        """Every replica's snapshot taken now, summed; a replica that does not answer within
        ``SNAPSHOT_DEADLINE_S`` (stuck, or being replaced) is counted from its last report,
        and listed with ``stale`` set."""
        async def fresh():
            answers = await self._broadcast("request_snapshot", deadline_s=SNAPSHOT_DEADLINE_S,
                                            required=False)
            for name, snap in answers:
                self.fresh[name] = snap
            self.stale = set(self.replica_ids()) - {name for name, _ in answers}
            return self.snapshot()
        return self._future(fresh())

    def _router_stats(self) -> list[dict]:
        from .registry import routers
        found = routers()
        return found[0].replica_stats() if found else []

    def replica_ids(self) -> list[str]:
        from .registry import routers
        found = routers()
        return found[0].replica_ids() if found else []

    # -- commands (every replica) ---------------------------------------------------------
    def flush(self, namespace: str | None = None) -> Future:
        return self._combined("flush", sum, namespace)

    def holds_namespace(self, namespace: str) -> Future:
        return self._combined("holds_namespace", any, namespace)

    def pin(self, namespace, tokens, ttl_s: float, owner: str = "") -> Future:
        return self._combined("pin", max, namespace, list(tokens), ttl_s, owner)

    def unpin(self, namespace, tokens) -> Future:
        return self._combined("unpin", any, namespace, list(tokens))

    def retire_namespace(self, namespace: str) -> Future:
        return self._combined("retire_namespace", sum, namespace)

    def expect_continuation(self, namespace, tokens) -> Future:
        return self._combined("expect_continuation", max, namespace, list(tokens))

    def publish(self, tokens, ttl_s: float, namespace: str = PUBLIC_NAMESPACE,
                owner: str = PUBLIC_NAMESPACE) -> Future:
        """Computes ``tokens`` into ``namespace`` and pins them on every replica; the first
        failure, else the first replica's Finished."""
        async def run():
            results = [r for _, r in await self._broadcast(
                "publish", list(tokens), ttl_s, namespace, owner, deadline_s=PUBLISH_DEADLINE_S)]
            failed = [r for r in results if r.reason is FinishReason.ERROR]
            return (failed or results)[0]
        return self._future(run())

    def check_integrity(self) -> Future:
        async def run():
            return {name: result for name, result in
                    await self._broadcast("check_integrity")}
        return self._future(run())

    def _combined(self, command: str, combine, *args) -> Future:
        async def run():
            return combine(r for _, r in await self._broadcast(command, *args))
        return self._future(run())

    async def _broadcast(self, command: str, *args, deadline_s: float | None = None,
                         required: bool = True) -> list[tuple[str, object]]:
        """(replica, result) of every replica that answers. One that leaves Serve's replica
        set while its call waits (killed, replaced) is left out: the router holds a targeted
        call until its replica is a candidate, which a dead one never is again. One still
        listed that has not answered within ``deadline_s`` (a dead one Serve has not noticed
        yet, a replacement still starting, a stuck one) is left out too when the answer is
        not ``required`` (stats), else the command fails with ``EngineUnavailable`` naming
        it, rather than holding the HTTP request for minutes (default ``COMMAND_DEADLINE_S``)."""
        deadline_s = COMMAND_DEADLINE_S if deadline_s is None else deadline_s
        names = self.replica_ids()
        answers = await asyncio.gather(*(self._call_while_present(name, deadline_s, command, *args)
                                         for name in names))
        late = [name for name, answer in zip(names, answers) if answer is _LATE]
        if late:
            log.warning("replicas %s did not answer %r within %g s", late, command, deadline_s)
            if required:
                raise EngineUnavailable(f"engine replica(s) {', '.join(late)} did not answer "
                                        f"{command!r} within {deadline_s:g} s; retry")
        return [answer for answer in answers if answer is not None and answer is not _LATE]

    async def _call_while_present(self, name: str, deadline_s: float, command: str, *args):
        """The replica's (name, result); None when it left the replica set; ``_LATE`` past
        the deadline (the call is cancelled either way)."""
        response = self.handle.call.remote(command, *args, target=name)
        task = asyncio.ensure_future(_awaited(response))
        deadline = time.monotonic() + deadline_s
        while True:
            left = deadline - time.monotonic()
            done, _ = await asyncio.wait({task}, timeout=max(0.0, min(BROADCAST_PRESENCE_CHECK_S, left)))
            if done:
                return task.result()
            gone = name not in self.replica_ids()
            if gone or time.monotonic() >= deadline:
                response.cancel()
                task.cancel()
                task.add_done_callback(_retrieved)     # its RequestCancelledError is expected
                return None if gone else _LATE

    def _future(self, coroutine) -> Future:
        """A concurrent Future for ``coroutine`` run on the running event loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, asyncio.get_running_loop())

    # -- lifecycle ------------------------------------------------------------------------
    def shutdown(self, grace_s: float = 10.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.admission.close()
        deadline = time.monotonic() + grace_s
        while self.admission.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        from .serve_app import stop_cluster
        stop_cluster(self.started_ray)


_LATE = object()      # a per-replica call that passed its deadline


def _retrieved(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


async def _awaited(response):
    return await response


class ClusterHandle:
    """One request's events (``async for``), like ``runtime.engine.handle.RequestHandle``."""

    def __init__(self, engine: ClusterEngine, request: Request):
        self.engine = engine
        self.request = request
        self.request_id = request.request_id
        self.finished: Finished | None = None
        self.replica: str | None = None
        self.placed: str | None = None       # the replica of the last try (started or not)
        self._events = self._run()
        self._stream = None
        self._aborted = False
        self._started = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.finished is not None:
            raise StopAsyncIteration
        event = await self._events.__anext__()
        if isinstance(event, Finished):
            self.finished = event
        return event

    def abort(self) -> None:
        if self.finished is None and not self._aborted:
            self._aborted = True
            if self._stream is not None:
                self._stream.cancel()

    async def _run(self):
        engine, request = self.engine, self.request
        refusal = await engine.admission.enter(request)
        if refusal is not None:
            yield _failed(request, *refusal)
            return
        left = False
        try:
            async for event in self._attempts():
                if isinstance(event, Finished):    # its consumer stops here: leave now
                    engine.admission.leave(request)
                    left = True
                yield event
        finally:
            if not left:                           # cancelled or closed early
                engine.admission.leave(request)

    async def _attempts(self):
        import ray.exceptions as rex
        request = _for_replica(self.request)
        failed_on: list[str] = []                  # replicas that died under this request
        for attempt in range(MAX_ATTEMPTS):
            if self._aborted:
                yield _aborted(request)
                return
            self._started = False
            try:
                async for event in self._one_attempt(request, tuple(failed_on)):
                    yield event
                return
            except (rex.RayActorError, rex.ActorUnavailableError) as e:
                log.warning("replica %s failed under request %s (attempt %d, started=%s): %s",
                            self.placed, request.request_id, attempt + 1, self._started, e)
                if self._started:
                    yield _failed(request, ErrorKind.INTERNAL, REPLICA_FAILED)
                    return
                if self.placed is not None and self.placed not in failed_on:
                    failed_on.append(self.placed)
                await asyncio.sleep(RETRY_PAUSE_S * 2 ** attempt)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the request fails, never the gateway
                if self._aborted:
                    yield _aborted(request)
                    return
                log.exception("request %s failed on its replica", request.request_id)
                yield _failed(request, ErrorKind.INTERNAL, type(e).__name__)
                return
        yield _failed(request, ErrorKind.OVERLOADED, REPLICA_FAILED)

    async def _one_attempt(self, request: Request, exclude: tuple[str, ...]):
        """The events of one try on the replica the router picks, not one of ``exclude``
        while there is another; ``placed`` says which one it was."""
        ttl = None if self.request.deadline is None else max(
            0.0, self.request.deadline - time.monotonic())
        self.placed = None
        self._stream = self.engine.handle.options(stream=True).generate.remote(
            request, ttl, exclude=exclude)
        try:
            async for replica, event in self._stream:
                self._started, self.replica = True, replica
                if isinstance(event, Finished):
                    self.engine.book(replica, event)
                    async for _ in self._stream:     # its end: Serve counts it done
                        pass
                    self.engine.request_done(replica, request.request_id)
                    self.engine.take_placement(request.request_id)
                yield event
        except asyncio.CancelledError:
            self._stream.cancel()
            raise
        finally:
            placed = self.engine.take_placement(request.request_id)
            self.placed = self.replica or placed
            if self.replica is not None:
                self.engine.request_done(self.replica, request.request_id)


def _for_replica(request: Request) -> Request:
    """The request as it travels: no compiled stop automaton or grammar state (the replica
    builds its own, from ``grammar_source``) and no deadline (a monotonic time of this
    host; the remaining time goes along)."""
    return dataclasses.replace(request, stop_automaton=None, grammar=None, deadline=None)


def _failed(request: Request, kind: ErrorKind, message: str) -> Finished:
    return Finished(FinishReason.ERROR, Usage(prompt_tokens=len(request.tokens),
                                              uncached_tokens=len(request.tokens)),
                    error_kind=kind, error_message=message, request_id=request.request_id)


def _aborted(request: Request) -> Finished:
    return Finished(FinishReason.ABORTED, Usage(prompt_tokens=len(request.tokens),
                                                uncached_tokens=len(request.tokens)),
                    error_message="aborted", request_id=request.request_id)
