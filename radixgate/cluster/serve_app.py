"""Starting the engine replicas as a Ray Serve deployment, and stopping them.

``start_cluster(settings, spec)`` starts a local Ray cluster, bound to loopback unless
``ray_host`` names another address (``local_ray.py``: binding, token authentication, the
watchdog), or joins ``ray_address``; runs the ``radixgate-engines`` deployment
(``replica.EngineReplica`` x N, or Ray Serve autoscaling between ``min_replicas`` and
``max_replicas``) with the prefix router (``serve_router.RadixPrefixRouter``) and returns
its handle. Ray restarts a replica whose health check fails or whose process dies.
``stop_cluster`` stops the deployment: on a local cluster, the application and then Ray
(``local_ray.stop_local_cluster``); on a joined one, Serve.
"""
from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass

from .local_ray import init_local_ray, quiet_unactionable_logs, stop_local_cluster
from .policy import RoutingParams
from .replica import EngineReplica, ReplicaSpec

log = logging.getLogger(__name__)
APP_NAME = "radixgate"
DEPLOYMENT_NAME = "radixgate-engines"
ROUTER_CLASS = "radixgate.cluster.serve_router:RadixPrefixRouter"
STATS_PERIOD_S = 0.5


@dataclass(frozen=True)
class ClusterSettings:
    replicas: int = 2
    ray_address: str = ""            # "": start a local Ray cluster in this process
    ray_host: str = "127.0.0.1"      # a local cluster's processes bind here
    min_replicas: int = 0            # both 0: a fixed number of replicas; else autoscaling
    max_replicas: int = 0
    target_ongoing_requests: float = 8.0
    max_ongoing_requests: int = 64   # per replica; beyond, the router takes the next choice
    num_cpus: float | None = None    # a local cluster's CPUs (None: Ray's count)
    cpus_per_replica: float = 0.0    # Ray's scheduling reservation, not the torch threads
    routing: RoutingParams = RoutingParams()


def start_cluster(settings: ClusterSettings, spec: ReplicaSpec):
    """The deployment's handle, once every replica is up."""
    # Ray's native failure-signal handler would turn the gateway's SIGTERM (drain, then
    # exit) into an abort
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    import ray
    from ray import serve
    from ray.serve.config import RequestRouterConfig
    if not ray.is_initialized():
        if settings.ray_address:
            quiet_unactionable_logs()
            ray.init(address=settings.ray_address, log_to_driver=False)
        else:
            init_local_ray(settings.ray_host, settings.num_cpus, _replica_env())
    serve.start(http_options={"location": "NoServer"})
    deployment = serve.deployment(
        EngineReplica, name=DEPLOYMENT_NAME,
        ray_actor_options={"num_cpus": settings.cpus_per_replica},
        max_ongoing_requests=settings.max_ongoing_requests,
        health_check_period_s=2.0, health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=5.0,
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASS,
            request_router_kwargs={"params": asdict(settings.routing),
                                   "block_size": spec.engine_config.cache.block_size},
            request_routing_stats_period_s=STATS_PERIOD_S,
            request_routing_stats_timeout_s=10.0),
        **_scaling(settings))
    handle = serve.run(deployment.bind(spec), name=APP_NAME, route_prefix=None)
    log.info("Ray Serve deployment %s is up (%s)", DEPLOYMENT_NAME, _scaling(settings))
    return handle


def _scaling(settings: ClusterSettings) -> dict:
    if not settings.max_replicas:
        return {"num_replicas": settings.replicas}
    return {"autoscaling_config": {
        "min_replicas": settings.min_replicas, "initial_replicas": settings.replicas,
        "max_replicas": settings.max_replicas,
        "target_ongoing_requests": settings.target_ongoing_requests}}


def _replica_env() -> dict:
    """What replica processes inherit: the import path (a checkout run without install)."""
    env = {}
    for name in ("PYTHONPATH", "TRITON_INTERPRET", "RADIXGATE_KERNEL_BACKEND"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def stop_cluster(started_ray: bool = True) -> None:
    if started_ray:
        stop_local_cluster(APP_NAME)
        return
    from ray import serve
    serve.shutdown()
