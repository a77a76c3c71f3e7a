"""``radixgate serve --replicas N``: the gateway in front of N engine replicas on Ray Serve.

Builds what the replicas get (``cluster.replica.ReplicaSpec``: the model settings, torch
threads split between replicas, an engine config whose tenant running/queue quotas are
off, since the gateway enforces them once for the deployment: ``radixgate/cluster/admission.py``),
holds the disk tier's folder and checks each replica's subfolder before Ray starts
(``radixgate/cluster/tier_folders.py``), starts the deployment and wraps its handle in
``cluster.client.ClusterEngine``. The gateway reads only the model's tokenizer and config
(it renders prompts and checks their length and token ids: ``read_model_info``); the
weights load in the replicas alone.
"""
from __future__ import annotations

import dataclasses
import logging
import os

from typing import TYPE_CHECKING

from radixgate.gateway.config import GatewayConfig

if TYPE_CHECKING:
    from radixgate.cluster.client import ClusterEngine

log = logging.getLogger("radixgate.gateway")


def start_cluster_engine(config: GatewayConfig, gateway_engine) -> ClusterEngine:
    """``gateway_engine``: the EngineConfig one engine would get (``state.engine_config``)."""
    from radixgate.cluster.client import ClusterEngine
    from radixgate.cluster.policy import RoutingParams
    from radixgate.cluster.replica import ReplicaSpec
    from radixgate.cluster.serve_app import ClusterSettings, start_cluster
    from radixgate.cluster.tier_folders import prepare_deployment_folder
    from radixgate.runtime.engine.engine_config import TenantQuota
    from radixgate.runtime.model.loader import read_model_info
    c = config.cluster
    slots = replica_slots(config)
    prepare_deployment_folder(config.cache, slots)     # before Ray: a clear error, no loop
    replica_engine = dataclasses.replace(
        gateway_engine, kv_events_endpoint=None, tenant_quotas=_replica_quotas(gateway_engine),
        default_quota=TenantQuota(max_namespaces=gateway_engine.default_quota.max_namespaces,
                                  max_pinned_tokens=gateway_engine.default_quota.max_pinned_tokens),
        max_queue=1 << 20)
    spec = ReplicaSpec(model_path=config.model.path, tiny=config.model.tiny,
                       max_model_len=config.model.max_model_len,
                       weights_dtype=config.model.weights_dtype,
                       threads=replica_threads(config.model.threads, c.replicas),
                       engine_config=replica_engine, events_host=c.events_host,
                       replica_slots=slots)
    settings = ClusterSettings(
        replicas=c.replicas, ray_address=c.ray_address, ray_host=c.ray_host,
        min_replicas=c.min_replicas,
        max_replicas=c.max_replicas, num_cpus=c.num_cpus or None,
        routing=RoutingParams(balance_abs=c.balance_abs, balance_rel=c.balance_rel,
                              load_tokens=c.load_tokens, routed_ttl_s=c.routed_ttl_s))
    model_info = read_model_info(config.model.path, tiny=config.model.tiny,
                                 max_model_len=config.model.max_model_len)
    handle = start_cluster(settings, spec)
    log.info("%d engine replicas on Ray Serve (%s), %d torch threads each", c.replicas,
             c.ray_address or "local cluster", spec.threads)
    engine = ClusterEngine(handle, model_info, gateway_engine, started_ray=not c.ray_address)
    engine.learn_block_count()
    return engine


def replica_slots(config: GatewayConfig) -> int:
    """The most replicas the deployment runs at once (``max_replicas`` under autoscaling):
    the replica indices, each with its disk tier subfolder and ``[cache.disk] gb / slots``."""
    c = config.cluster
    return max(c.replicas, c.max_replicas)


def replica_threads(configured: int, replicas: int) -> int:
    """Torch threads per replica: the configured count, else the cores split evenly."""
    if configured > 0:
        return configured
    return max(1, (os.cpu_count() or 1) // max(1, replicas))


def _replica_quotas(config):
    """The tenants' quotas without the running / queued limits the gateway enforces."""
    quotas = config.tenant_quotas or {}
    return {name: dataclasses.replace(q, max_running=None, max_queued=None)
            for name, q in quotas.items()}
