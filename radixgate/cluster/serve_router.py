"""The Ray Serve request router: ``policy.PrefixRouter`` behind Serve's public router API.

Ray Serve builds one router per deployment handle, in the handle's process (the
gateway's), and asks ``choose_replicas`` for each request; it then sends the request to
the first rank's replica unless that one is full (``max_ongoing_requests``), then the next.

- Loads are this router's own requests in flight per replica (``on_request_routed``, and
  ``request_done`` from the gateway when a stream ends or Serve's ``on_request_completed``):
  exact, not a sampled queue length, since one gateway sends everything.
- The prefix index is fed by each replica's KV events (``subscriber.py``), at the endpoint
  the replicas report in ``record_routing_stats`` (the live one and the replay one the
  subscriber resyncs from); a replica that dies or leaves is forgotten, its index entries
  with it.
- A call with ``target=<replica id>`` (the gateway's per-replica commands and stats) goes
  to that replica only (while it is not a candidate, Serve backs off and asks again: every
  choice sets the request's ``routing_context.should_backoff``); a request with ``exclude=(replica ids)`` (the gateway's retry of a
  request whose replica died) goes to another one while there is another.
- Where each request went is kept for the gateway (``take_placement``): a retry excludes
  the replica that died before answering. The last ``MAX_PLACEMENTS`` are kept.

The gateway finds its router through ``registry.routers()`` (same process) to read the
replicas' stats.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from . import registry
from .policy import PrefixRouter, RoutingParams
from .prefix_index import PrefixIndex
from .subscriber import KVEventSubscriber

PENDING_SEED = "radixgate-router-pending"
MAX_PLACEMENTS = 4096


class RadixPrefixRouter(RequestRouter):
    def initialize_state(self, **kwargs) -> None:
        self.params = RoutingParams(**kwargs.get("params", {}))
        self.lock = threading.Lock()
        self.index = PrefixIndex(self.params.routed_ttl_s)
        # until a replica reports its hash seed, prompts are keyed by a provisional one:
        # only the router's own routed notes match then (they expire), never a KV event
        self.policy = PrefixRouter(PENDING_SEED, kwargs.get("block_size", 16), self.params,
                                   self.index)
        self.subscriber = KVEventSubscriber(self.index, self.lock)
        self.in_flight: dict[str, set[str]] = {}        # replica -> engine request ids
        self.routed_ids: dict[str, tuple[str, str]] = {}  # Serve's id -> (replica, request id)
        self.routed_by_reason: dict[str, int] = {}
        self.placements: OrderedDict[str, str] = OrderedDict()   # request id -> replica
        registry.register(self)

    # -- choosing ---------------------------------------------------------------------
    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        self._follow(candidate_replicas)
        if pending_request is not None:
            # Serve retries a choice that routed nowhere (a target that is gone, replicas
            # that are full) at once, without yielding, while this is False: set, it backs
            # off. Left False, a call targeted at a dead replica spun the router's event
            # loop forever and every request of the gateway stalled behind it.
            pending_request.routing_context.should_backoff = True
        kwargs = pending_request.kwargs if pending_request is not None else {}
        target = kwargs.get("target")
        if target is not None:
            return [[by_id[target]]] if target in by_id else []
        by_id = _without(by_id, kwargs.get("exclude") or ())
        request = _engine_request(pending_request)
        if request is None or not by_id:
            return [sorted(by_id.values(), key=lambda r: self.load(r.replica_id.unique_id))]
        loads = {name: self.load(name) for name in by_id}
        with self.lock:
            decision = self.policy.rank(request.namespace, request.tokens, loads,
                                        hint=request.routing_hint or None)
        self.routed_by_reason[decision.reason] = self.routed_by_reason.get(decision.reason, 0) + 1
        return [[by_id[decision.ranked[0]]], [by_id[name] for name in decision.ranked[1:]]]

    def load(self, replica: str) -> int:
        return len(self.in_flight.get(replica, ()))

    def _follow(self, replicas: list[RunningReplica]) -> None:
        """Subscribes to the KV events of replicas that reported their endpoint, and learns
        the hash seed and block size from the first one."""
        for replica in replicas:
            stats = replica.routing_stats or {}
            endpoint = stats.get("kv_events_endpoint")
            if endpoint:
                self.subscriber.follow(replica.replica_id.unique_id, endpoint,
                                       stats.get("kv_events_replay_endpoint"))
                if self.policy.seed == PENDING_SEED:
                    self.policy = PrefixRouter(stats["seed"], stats["block_size"], self.params,
                                               self.index)

    # -- bookkeeping ------------------------------------------------------------------
    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result) -> None:
        request = _engine_request(pending_request)
        if request is not None:
            self.in_flight.setdefault(replica_id.unique_id, set()).add(request.request_id)
            self.routed_ids[pending_request.metadata.internal_request_id] = (
                replica_id.unique_id, request.request_id)
            self.placements[request.request_id] = replica_id.unique_id
            self.placements.move_to_end(request.request_id)
            while len(self.placements) > MAX_PLACEMENTS:
                self.placements.popitem(last=False)

    def take_placement(self, request_id: str) -> str | None:
        """The replica the last try of ``request_id`` went to (once: it is forgotten)."""
        return self.placements.pop(request_id, None)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        replica, request_id = self.routed_ids.pop(internal_request_id, (None, None))
        if replica is not None:
            self.request_done(replica, request_id)

    def request_done(self, replica: str, request_id: str) -> None:
        """The gateway saw the request's stream end (Serve's own completion notice can come
        later than the next routing decision)."""
        self.in_flight.get(replica, set()).discard(request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        current = {r.replica_id.unique_id for r in replicas}
        for name in list(self.in_flight):
            if name not in current:
                self._forget(name)

    def _forget(self, replica: str) -> None:
        self.in_flight.pop(replica, None)
        self.subscriber.forget(replica)

    # -- what the gateway reads -------------------------------------------------------
    def replica_stats(self) -> list[dict]:
        """Each current replica's last reported routing stats, plus this router's view."""
        out = []
        for name, replica in sorted(self.curr_replicas.items(), key=lambda kv: kv[0].unique_id):
            stats = dict(replica.routing_stats or {})
            stats["replica"] = name.unique_id
            stats["in_flight"] = self.load(name.unique_id)
            with self.lock:
                stats["indexed_blocks"] = self.index.stored_blocks(name.unique_id)
            out.append(stats)
        return out

    def replica_ids(self) -> list[str]:
        return sorted(r.unique_id for r in self.curr_replicas)


def _without(by_id: dict, exclude) -> dict:
    """The candidates but the excluded ones, unless none would be left."""
    kept = {name: r for name, r in by_id.items() if name not in exclude}
    return kept or by_id


def _engine_request(pending_request: PendingRequest | None):
    if pending_request is None or not pending_request.args:
        return None
    request = pending_request.args[0]
    return request if hasattr(request, "tokens") and hasattr(request, "namespace") else None
