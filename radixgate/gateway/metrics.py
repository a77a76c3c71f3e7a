"""Prometheus metrics: one ``CollectorRegistry`` per app (tests build many apps).

Event-driven series (updated by handlers): prefix-cache queries and hit tokens per tenant,
prompt/generation token counters, request outcomes, TTFT and inter-token latency
histograms. Snapshot series (read from the latest ``EngineSnapshot`` at scrape time): KV
blocks by state, running/waiting requests, evictions by reason, pinned tokens, plus
vLLM-named gauges (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``, ``vllm:gpu_cache_usage_perc``) for routers that read those.

``render(tenant)`` gives the exposition text; a tenant sees only series labelled with its
own tenant, the admin everything.
"""
from __future__ import annotations

from typing import Callable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixgate.runtime.engine.api import Usage

prometheus_client.disable_created_metrics()   # no *_created series: less noise per tenant

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


_VLLM_FINISHED = {"eos": "stop", "stop_sequence": "stop", "length": "length", "aborted": "abort"}
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class GatewayMetrics:
    def __init__(self, snapshot: Callable[[], object | None],
                 model_name: Callable[[], str] = lambda: "radixgate"):
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        r = self.registry
        self.cache_queries = Counter("radixgate_prefix_cache_queries", "Prompts matched against "
                                     "the prefix cache", ["tenant"], registry=r)
        self.cache_query_tokens = Counter("radixgate_prefix_cache_query_tokens", "Prompt tokens "
                                          "looked up in the prefix cache", ["tenant"], registry=r)
        self.cache_hit_tokens = Counter("radixgate_prefix_cache_hit_tokens", "Prompt tokens "
                                        "served from the prefix cache", ["tenant"], registry=r)
        self.prompt_tokens = Counter("radixgate_prompt_tokens", "Prompt tokens by cache outcome",
                                     ["tenant", "kind"], registry=r)
        self.generation_tokens = Counter("radixgate_generation_tokens", "Generated tokens",
                                         ["tenant"], registry=r)
        self.requests = Counter("radixgate_requests", "Finished HTTP generation requests",
                                ["tenant", "api", "outcome"], registry=r)
        self.continuations = Counter("radixgate_expected_continuations", "Responses that "
                                     "ended in a tool call, kept longer in the prefix cache "
                                     "until the tool result comes back", ["tenant"], registry=r)
        self.template_renders = Counter("radixgate_template_renders", "Chat-template "
                                        "applications spent rendering request prompts",
                                        ["tenant"], registry=r)
        self.ttft = Histogram("radixgate_time_to_first_token_seconds", "Time to first token",
                              ["tenant", "cache"], buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("radixgate_inter_token_latency_seconds", "Time between output "
                             "tokens", ["tenant"], buckets=_ITL_BUCKETS, registry=r)
        self.vllm = _VllmSeries(r)
        r.register(_SnapshotCollector(snapshot, model_name))

    def observe_finished(self, tenant: str, api: str, outcome: str, usage: Usage,
                         e2e_s: float | None = None) -> None:
        self.requests.labels(tenant, api, outcome).inc()
        if usage.prompt_tokens <= 0 or outcome.startswith("error"):
            return
        self.vllm.observe(self.model_name(), tenant, _VLLM_FINISHED.get(outcome), usage, e2e_s)
        self.cache_queries.labels(tenant).inc()
        self.cache_query_tokens.labels(tenant).inc(usage.prompt_tokens)
        self.cache_hit_tokens.labels(tenant).inc(usage.cache_read_tokens)
        for kind, value in (("cache_read", usage.cache_read_tokens),
                            ("cache_creation", usage.cache_creation_tokens),
                            ("uncached", usage.uncached_tokens)):
            self.prompt_tokens.labels(tenant, kind).inc(value)
        self.generation_tokens.labels(tenant).inc(usage.output_tokens)
        if usage.ttft_s is not None:
            cache = "hit" if usage.cache_read_tokens > 0 else "miss"
            self.ttft.labels(tenant, cache).observe(usage.ttft_s)

    def observe_gap(self, tenant: str, seconds: float, tokens: int) -> None:
        """An output delta of ``tokens`` tokens arrived ``seconds`` after the previous one."""
        per_token = seconds / max(1, tokens)
        vllm_itl = self.vllm.itl.labels(self.model_name(), tenant)
        for _ in range(max(1, tokens)):
            self.itl.labels(tenant).observe(per_token)
            vllm_itl.observe(per_token)

    def render(self, tenant: str | None = None) -> bytes:
        """Exposition text; ``tenant`` set = only series carrying ``tenant="<tenant>"``."""
        if tenant is None:
            return generate_latest(self.registry)
        return generate_latest(_TenantView(self.registry, tenant))


class _VllmSeries:
    """The series vLLM exports, under its names, for routers (llm-d, Kubernetes inference
    gateways) and Grafana dashboards: each with ``model_name`` (and ``tenant``, so a tenant
    sees its own)."""

    def __init__(self, r: CollectorRegistry):
        labels = ["model_name", "tenant"]
        self.prompt = Counter("vllm:prompt_tokens", "Prompt tokens (vLLM name)", labels,
                              registry=r)
        self.generation = Counter("vllm:generation_tokens", "Generated tokens (vLLM name)",
                                  labels, registry=r)
        self.queries = Counter("vllm:prefix_cache_queries", "Prefix cache query tokens "
                               "(vLLM name)", labels, registry=r)
        self.hits = Counter("vllm:prefix_cache_hits", "Prefix cache hit tokens (vLLM name)",
                            labels, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests by reason (vLLM "
                               "name)", [*labels, "finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token (vLLM "
                              "name)", labels, buckets=_TTFT_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Request latency (vLLM name)",
                             labels, buckets=_E2E_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between output tokens "
                             "(vLLM name)", labels, buckets=_ITL_BUCKETS, registry=r)

    def observe(self, model: str, tenant: str, finished_reason: str | None, usage: Usage,
                e2e_s: float | None) -> None:
        self.prompt.labels(model, tenant).inc(usage.prompt_tokens)
        self.generation.labels(model, tenant).inc(usage.output_tokens)
        self.queries.labels(model, tenant).inc(usage.prompt_tokens)
        self.hits.labels(model, tenant).inc(usage.cache_read_tokens)
        if finished_reason is not None:
            self.success.labels(model, tenant, finished_reason).inc()
        if usage.ttft_s is not None:
            self.ttft.labels(model, tenant).observe(usage.ttft_s)
        if e2e_s is not None:
            self.e2e.labels(model, tenant).observe(e2e_s)


class _SnapshotCollector(Collector):
    def __init__(self, snapshot: Callable[[], object | None], model_name: Callable[[], str]):
        self._snapshot = snapshot
        self._model_name = model_name

    def collect(self):
        snap = self._snapshot()
        if snap is None:
            return
        blocks = GaugeMetricFamily("radixgate_kv_blocks", "KV blocks by state (disjoint)",
                                   labels=["state"])
        for state in ("free", "cached", "pinned", "in_use"):
            blocks.add_metric([state], getattr(snap.blocks, state))
        yield blocks
        yield GaugeMetricFamily("radixgate_kv_blocks_total", "KV blocks in the pool",
                                value=snap.blocks.total)
        usage = (snap.blocks.in_use + snap.blocks.pinned) / max(1, snap.blocks.total)
        yield GaugeMetricFamily("radixgate_kv_cache_usage_ratio", "Share of KV blocks in use "
                                "or pinned (not reclaimable)", value=usage)
        yield GaugeMetricFamily("radixgate_requests_running", "Running requests", value=snap.running)
        yield GaugeMetricFamily("radixgate_requests_waiting", "Waiting requests", value=snap.waiting)
        yield GaugeMetricFamily("radixgate_cached_tokens", "Tokens held in the radix tree",
                                value=snap.tree.cached_tokens)
        evictions = CounterMetricFamily("radixgate_cache_evictions", "Evicted tree nodes by "
                                        "reason", labels=["reason"])
        for reason in ("lru", "ttl", "flush"):
            evictions.add_metric([reason], snap.evictions.get(reason, 0))
        yield evictions
        yield CounterMetricFamily("radixgate_preemptions", "Running requests preempted to free "
                                  "KV blocks (requeued; their prefix stays cached)",
                                  value=snap.preemptions)
        yield from _spec_series(snap)
        yield from _tenant_gauges(snap)
        yield from _tier_series(snap)
        yield from _replica_gauges(snap)
        yield from _vllm_gauges(snap, usage, self._model_name())


def _spec_series(snap):
    """``radixgate_spec_*``: speculative decoding (radixgate/runtime/engine/spec.py)."""
    for key, name, text in (("steps", "verify_steps", "Decode steps that verified drafts"),
                            ("drafted", "draft_tokens", "Draft tokens checked"),
                            ("accepted", "accepted_tokens", "Draft tokens kept")):
        yield CounterMetricFamily(f"radixgate_spec_{name}", text, value=snap.spec.get(key, 0))


def _tier_series(snap):
    """``radixgate_kv_tier_*``: the KV in memory and in the disk tier side by side."""
    tier = snap.tier
    held = snap.blocks.cached + snap.blocks.pinned
    blocks = GaugeMetricFamily("radixgate_kv_tier_blocks", "KV blocks held per tier (memory: "
                               "the tree's; disk: records)", labels=["tier"])
    size = GaugeMetricFamily("radixgate_kv_tier_bytes", "Bytes of KV held per tier",
                             labels=["tier"])
    hits = CounterMetricFamily("radixgate_kv_tier_hit_tokens", "Prompt tokens reused, by the "
                               "tier they came from", labels=["tier"])
    blocks.add_metric(["memory"], held)
    size.add_metric(["memory"], held * snap.block_size * snap.kv_bytes_per_token)
    hit_tokens = getattr(snap, "hit_tokens", None) or {}
    for name in ("memory", "disk"):
        hits.add_metric([name], hit_tokens.get(name, 0))
    if tier is not None:
        blocks.add_metric(["disk"], tier.blocks)
        size.add_metric(["disk"], tier.bytes)
    yield from (blocks, size, hits)
    if tier is None:
        return
    for name, doc, value in (
            ("loads", "Requests whose prefix was loaded from the disk tier", tier.loads),
            ("loaded_blocks", "KV blocks loaded from the disk tier", tier.loaded_blocks),
            ("load_bytes", "Bytes loaded from the disk tier", tier.load_bytes),
            ("writes", "KV blocks written to the disk tier", tier.writes),
            ("write_bytes", "Bytes written to the disk tier", tier.write_bytes),
            ("evictions", "Disk tier records removed for its budget", tier.evicted)):
        yield CounterMetricFamily(f"radixgate_kv_tier_{name}", doc, value=value)
    drops = CounterMetricFamily("radixgate_kv_tier_drops", "KV blocks the disk tier did not "
                                "write or serve, by reason", labels=["reason"])
    for reason, count in tier.drops.items():
        drops.add_metric([reason], count)
    yield drops
    yield GaugeMetricFamily("radixgate_kv_tier_budget_bytes", "The disk tier's budget",
                            value=tier.budget_bytes)
    yield GaugeMetricFamily("radixgate_kv_tier_disk_full", "1 while the disk tier's disk is "
                            "full (writes stopped)", value=int(tier.full))


def _replica_gauges(snap):
    """Scale-out: the same figures per engine replica (label ``replica``); none with one
    engine."""
    replicas = getattr(snap, "replicas", ())
    if not replicas:
        return
    blocks = GaugeMetricFamily("radixgate_replica_kv_blocks", "KV blocks by state per "
                               "replica", labels=["replica", "state"])
    running = GaugeMetricFamily("radixgate_replica_requests_running", "Running requests per "
                                "replica", labels=["replica"])
    waiting = GaugeMetricFamily("radixgate_replica_requests_waiting", "Waiting requests per "
                                "replica", labels=["replica"])
    hit_rate = GaugeMetricFamily("radixgate_replica_hit_rate", "Cached / prompt tokens of "
                                 "the requests a replica finished", labels=["replica"])
    for r in replicas:
        for state in ("free", "cached", "pinned", "in_use"):
            blocks.add_metric([r.replica, state], getattr(r.blocks, state))
        running.add_metric([r.replica], r.running)
        waiting.add_metric([r.replica], r.waiting)
        hit_rate.add_metric([r.replica], r.hit_rate)
    yield from (blocks, running, waiting, hit_rate)


def _vllm_gauges(snap, usage: float, model: str):
    for name, doc, value in (
            ("vllm:num_requests_running", "Running requests (vLLM name)", snap.running),
            ("vllm:num_requests_waiting", "Waiting requests (vLLM name)", snap.waiting),
            ("vllm:kv_cache_usage_perc", "KV usage ratio 0..1 (vLLM name)", usage),
            ("vllm:gpu_cache_usage_perc", "KV usage ratio 0..1 (old vLLM name)", usage)):
        family = GaugeMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([model], value)
        yield family


def _tenant_gauges(snap):
    running = GaugeMetricFamily("radixgate_tenant_requests_running", "Running requests per "
                                "tenant", labels=["tenant"])
    waiting = GaugeMetricFamily("radixgate_tenant_requests_waiting", "Waiting requests per "
                                "tenant", labels=["tenant"])
    pinned = GaugeMetricFamily("radixgate_tenant_pinned_tokens", "Pinned tokens per tenant",
                               labels=["tenant"])
    for name, counts in snap.tenants.items():
        running.add_metric([name], counts.running)
        waiting.add_metric([name], counts.waiting)
        pinned.add_metric([name], counts.pinned_tokens)
    return running, waiting, pinned


class _TenantView(Collector):
    """The registry's families with only the samples labelled with one tenant."""

    def __init__(self, registry: CollectorRegistry, tenant: str):
        self._registry = registry
        self._tenant = tenant

    def collect(self):
        for family in self._registry.collect():
            samples = [s for s in family.samples if s.labels.get("tenant") == self._tenant]
            if not samples:
                continue
            scoped = Metric(family.name, family.documentation, family.type, family.unit)
            scoped.samples = samples
            yield scoped
