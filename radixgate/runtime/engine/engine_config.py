"""Engine configuration: plain frozen values, no side effects (pydantic only at the HTTP edge)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from radixgate.kv.config import CacheConfig

from .spec import SpecConfig


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """Per-tenant limits. ``None`` means unlimited.

    max_running: requests of this tenant running at once (more wait in the queue).
    max_queued: requests of this tenant waiting at once (more are rejected: OVER_CAPACITY).
    max_pinned_tokens: tokens this tenant may keep pinned (breakpoint pins beyond it are skipped).
    max_namespaces: cache namespaces (one per ``cache_salt``) this tenant keeps alive; beyond
    it the least recently used idle ones are evicted and dropped. Busy ones (a request
    waiting or running in it, an unexpired pin) are kept, so the count may exceed the cap
    while they are busy (radixgate/kv/core/namespaces.py).
    """

    max_running: int | None = None
    max_queued: int | None = None
    max_pinned_tokens: int | None = None
    max_namespaces: int | None = 64


QuotaSource = Mapping[str, TenantQuota] | Callable[[str], TenantQuota] | None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How the engine sizes its KV cache and schedules steps.

    ``cache``: the KV cache's one config (budget, block size, eviction policy, baselines;
    ``kv.CacheConfig``), handed down as it is to the pool, the tree and the block
    manager. KV size: ``num_blocks`` when given (tests), else ``cache.kv_cache_bytes``
    divided by the bytes one block takes (2 x layers x kv_heads x head_dim x dtype bytes x
    block_size). ``window_blocks``: the window layers' pool beside ``num_blocks`` (tests;
    None: ``cache.window_ratio``'s share; radixgate/kv/groups/window_plan.py).
    ``max_step_tokens`` is the per-step token budget shared by decodes and prefill chunks;
    ``prefill_chunk`` caps one request's prefill tokens per step.
    ``solo_step_tokens``: the budget (and chunk cap) of a step in which no sequence decodes,
    so no one waits on it: a prompt prefilled alone goes in fewer, bigger chunks (each chunk
    reads every weight once and, for int4 weights above 64 rows, dequantizes every layer;
    2,048 tokens in one chunk instead of four: 1.9 against 2.2-2.4 s on the default model).
    ``debug_integrity`` runs the tree/pool integrity check whenever the engine goes idle.
    ``record_logits`` keeps each request's per-step logits and top-2 gaps for
    ``Engine.debug_trace`` (tests of the near-tie rule; costs memory).
    ``pin_share`` bounds all pinned tokens together to this share of the KV budget.
    ``max_unsent_events``: a request submitted from asyncio whose reader leaves more events
    than this unread is ended with a TIMEOUT error (``handle.AsyncSink``; None: no bound).
    ``share_wait_min_tokens``: a waiting request whose prompt shares at least this many more
    tokens with a prompt being prefilled than it matches in the tree waits for that prefill
    (``None``: one block).
    ``jump_forward``: where a request's grammar allows exactly one continuation, append it
    without sampling and compute it in one step (``radixgate/runtime/engine/grammar_masks.py``).
    ``kv_events_endpoint``: where the tree's KV events are published (vLLM's format over
    ZMQ PUB, ``radixgate/kv/events/publisher.py``; None: off); a loopback address unless
    ``kv_events_allow_remote``. ``kv_events_rank``: the batches' ``data_parallel_rank``;
    ``kv_events_topic``: the ZMQ topic frame of every message. ``kv_events_replay_endpoint``:
    where a subscriber that lost batches asks for them again (a ZMQ ROUTER; None: none).
    ``adapt_threads``: the engine thread runs its steps on one torch thread while other
    processes keep a core busy, on all of them otherwise (``cpu_threads.ThreadGovernor``);
    another thread count sums in another order, so logits may differ in their last bits,
    unless ``deterministic``: every step in the model's deterministic mode
    (``LlamaModel.forward``): a position's logits are the same bits however it was scheduled
    (alone or batched, prefill chunk or decode, cached, from the disk tier or recomputed,
    1 or 2 threads, any KV dtype); the engine refuses to start where that cannot hold.
    ``spec``: speculative decoding with drafts from each request's own text
    (``radixgate/runtime/engine/spec.py``; ``SamplingParams.speculative`` False turns it off for one
    request).
    """

    cache: CacheConfig = field(default_factory=CacheConfig)
    num_blocks: int | None = None
    window_blocks: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_step_tokens: int = 512
    solo_step_tokens: int = 2048
    max_queue: int = 256
    prefill_chunk: int | None = None
    debug_integrity: bool = False
    record_logits: bool = False
    tenant_quotas: QuotaSource = None
    default_quota: TenantQuota = field(default_factory=TenantQuota)
    pin_share: float = 0.5
    share_wait_min_tokens: int | None = None
    snapshot_interval_s: float = 0.25
    max_unsent_events: int | None = None
    top_prefixes: int = 10
    adapt_threads: bool = True
    deterministic: bool | None = None    # None: on where the model allows (EngineCore says)
    spec: SpecConfig = field(default_factory=SpecConfig)
    jump_forward: bool = True
    kv_events_endpoint: str | None = None
    kv_events_allow_remote: bool = False
    kv_events_rank: int | None = None
    kv_events_topic: str = ""
    kv_events_replay_endpoint: str | None = None

    def __post_init__(self) -> None:
        if self.max_step_tokens <= 0 or self.max_num_seqs <= 0 or self.solo_step_tokens <= 0:
            raise ValueError("max_step_tokens, solo_step_tokens and max_num_seqs must be positive")
        if not 0.0 <= self.pin_share <= 1.0:
            raise ValueError("pin_share must lie in [0, 1]")

    def quota_for(self, tenant: str) -> TenantQuota:
        source = self.tenant_quotas
        if source is None:
            return self.default_quota
        if callable(source):
            return source(tenant)
        return source.get(tenant, self.default_quota)

    @property
    def chunk_tokens(self) -> int:
        return min(self.prefill_chunk or self.max_step_tokens, self.max_step_tokens)

    @property
    def solo_budget(self) -> int:
        """A step's token budget when no sequence decodes (never below ``max_step_tokens``)."""
        return max(self.solo_step_tokens, self.max_step_tokens)

    @property
    def solo_chunk_tokens(self) -> int:
        return min(self.prefill_chunk or self.solo_budget, self.solo_budget)

    @property
    def share_wait_tokens(self) -> int:
        return self.share_wait_min_tokens or self.cache.block_size
