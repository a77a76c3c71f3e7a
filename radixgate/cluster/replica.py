"""One engine replica of the Ray Serve deployment (the class body; ``serve_app.py``
wraps it in ``serve.deployment``).

A replica claims its index first when there is a disk tier (the lowest free one:
``tier_folders.py``; its tier is ``[cache.disk] dir/replica-<index>`` with its part of the budget),
loads the model, starts an ``Engine`` whose KV events go out on a loopback ZMQ
endpoint with a free port (the replica's id is the topic), and answers:

- ``generate(request, ttl_s)``: an async generator of ``(replica, event)``; a cancelled
  stream (the gateway's client left) aborts the engine request; a structured-output
  request's grammar is compiled here from its source (a grammar state does not pickle);
- ``call(command, *args, target=...)``: an engine command (flush, pin, unpin, publish,
  expect_continuation, check_integrity, snapshot, retire_namespace, holds_namespace) on this
  replica; ``target`` (and ``generate``'s ``exclude``) is read by the router only
  (``serve_router.py``: a call for one replica goes to that one; a retried request avoids
  the replicas that failed it);
- ``record_routing_stats()``: what the router and the gateway's stats read (Ray Serve
  polls it): the KV-event endpoints (live, replay) and hash seed, block size, running / waiting requests,
  block counts, pinned tokens per tenant, ``pins_settled`` (the requests with breakpoints
  whose stream ended before that snapshot: its pinned counts include their pins; the
  gateway's ``admission.PinBook`` drops their reservations) and the engine's latest snapshot;
- ``check_health()``: raises once the engine thread has stopped, so Serve replaces it.

On a loopback Ray node the replica keeps Serve's own gRPC server on loopback too
(``local_ray.serve_grpc_on_loopback``).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything a replica needs to build its engine (plain values: pickled to Ray)."""

    model_path: str = "default"
    tiny: bool = False
    max_model_len: int | None = None
    weights_dtype: str = "auto"
    threads: int = 0
    engine_config: object = None          # runtime.engine.engine_config.EngineConfig
    events_host: str = "127.0.0.1"
    replica_slots: int = 1                # the most replicas at once: indices 0 .. slots-1


GRAMMAR_CACHE = 64
PIN_ENDS_KEPT = 4096          # requests with breakpoints that ended, for ``pins_settled``
PIN_ENDS_WINDOW_S = 60.0      # ... listed in every report for this long after the snapshot
COMMANDS = ("flush", "pin", "unpin", "publish", "expect_continuation", "check_integrity",
            "request_snapshot", "retire_namespace", "holds_namespace")


class EngineReplica:
    def __init__(self, spec: ReplicaSpec):
        from radixgate.runtime.engine.engine import Engine
        from radixgate.runtime.engine.cpu_threads import set_cpu_threads
        from radixgate.runtime.model.loader import load_model

        from .local_ray import serve_grpc_on_loopback
        serve_grpc_on_loopback()
        self.name = _replica_name()
        self.index, self._claim, cache = replica_cache(spec)
        set_cpu_threads(spec.threads)
        loaded = load_model(spec.model_path, tiny=spec.tiny, max_model_len=spec.max_model_len,
                            weights_dtype=spec.weights_dtype)
        config = dataclasses.replace(
            spec.engine_config, cache=cache, kv_events_endpoint=f"tcp://{spec.events_host}:*",
            kv_events_replay_endpoint=f"tcp://{spec.events_host}:*", kv_events_topic=self.name,
            kv_events_allow_remote=spec.events_host not in ("127.0.0.1", "localhost", "::1"))
        self.engine = Engine(loaded, config)
        self.engine.start()
        self.seed = self.engine.kv_events.tracker.seed
        self._compiler = None
        self._grammars: dict = {}
        self._grammar_lock = threading.Lock()
        self._pin_ends: deque[tuple[float, str]] = deque(maxlen=PIN_ENDS_KEPT)
        log.info("replica %s (index %s) ready: KV events on %s%s", self.name, self.index,
                 self.engine.kv_events.bound_endpoint,
                 f", KV disk tier {cache.disk.dir} ({cache.disk.gb:g} GiB)"
                 if cache.disk.enabled else "")

    async def generate(self, request, ttl_s: float | None = None, target: str | None = None,
                       exclude: tuple[str, ...] = ()):
        import asyncio
        deadline = None if ttl_s is None else time.monotonic() + ttl_s
        grammar = None
        if request.grammar_source:
            compiled = await asyncio.to_thread(self._compiled, request.grammar_source)
            grammar = compiled.matcher()
        request = dataclasses.replace(request, deadline=deadline, grammar=grammar)
        handle = self.engine.submit(request)
        try:
            async for event in handle:
                yield self.name, event
        finally:
            handle.abort()            # no-op once finished; a cancelled stream ends here
            if request.breakpoints:   # its pins (made at prefill) are in the tree by now
                self._pin_ends.append((time.monotonic(), request.request_id))

    def _compiled(self, source: str):
        """The grammar compiled against this replica's vocabulary (the gateway validated
        it already), the last ``GRAMMAR_CACHE`` of them kept."""
        from radixgate.runtime.engine.grammar import GrammarCompiler
        with self._grammar_lock:
            if self._compiler is None:
                loaded = self.engine.loaded
                self._compiler = GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size)
            compiled = self._grammars.pop(source, None) or self._compiler.compile(source)
            self._grammars[source] = compiled
            while len(self._grammars) > GRAMMAR_CACHE:
                self._grammars.pop(next(iter(self._grammars)))
            return compiled

    async def call(self, command: str, *args, target: str | None = None):
        import asyncio
        if command not in COMMANDS:
            raise ValueError(f"unknown replica command {command!r}")
        result = await asyncio.wrap_future(getattr(self.engine, command)(*args))
        if command == "request_snapshot":
            result = picklable_snapshot(result)
        return self.name, result

    def record_routing_stats(self) -> dict:
        snap = self.engine.snapshot()
        return {"replica": self.name, "index": self.index,
                "kv_events_endpoint": self.engine.kv_events.bound_endpoint,
                "kv_events_replay_endpoint": self.engine.kv_events.bound_replay_endpoint,
                "seed": self.seed, "block_size": self.engine.block_size,
                "running": snap.running, "waiting": snap.waiting,
                "blocks_total": snap.blocks.total, "blocks_free": snap.blocks.free,
                "blocks_cached": snap.blocks.cached, "blocks_in_use": snap.blocks.in_use,
                "pinned_tokens": {t: c.pinned_tokens for t, c in snap.tenants.items()
                                  if c.pinned_tokens},
                "pins_settled": [rid for t, rid in list(self._pin_ends)
                                 if snap.time - PIN_ENDS_WINDOW_S <= t <= snap.time],
                "snapshot": picklable_snapshot(snap)}

    def check_health(self) -> None:
        if self.engine.core.draining or not self.engine.is_running():
            raise RuntimeError(f"replica {self.name}: the engine is not running")

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown(grace_s=0)
        claim = getattr(self, "_claim", None)
        if claim is not None:          # after the engine closed its tier: the index is free
            os.close(claim)


def replica_cache(spec: ReplicaSpec):
    """(index, claim fd, cache config) of this replica: with a disk tier, the lowest free
    index's subfolder and its part of the budget (``tier_folders.py``); without one, no
    index."""
    cache = spec.engine_config.cache
    if not cache.disk.enabled:
        return None, None, cache
    from .tier_folders import claim_replica_index
    index, claim = claim_replica_index(cache, spec.replica_slots)
    return index, claim, cache.for_replica(index, spec.replica_slots)


def picklable_snapshot(snap):
    """``snap`` with plain dicts for its read-only mappings (which do not pickle)."""
    tier = None if snap.tier is None else dataclasses.replace(snap.tier, drops=dict(snap.tier.drops))
    return dataclasses.replace(
        snap, tenants=dict(snap.tenants), evictions=dict(snap.evictions),
        tenant_prefixes=dict(snap.tenant_prefixes), hit_tokens=dict(snap.hit_tokens), tier=tier)


def _replica_name() -> str:
    """This replica's id as Ray Serve names it (the router's key for it)."""
    from ray import serve
    return serve.get_replica_context().replica_id.unique_id
