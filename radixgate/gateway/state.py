"""The app's shared state: config, keys, engine (loaded in a background thread), books.

``GatewayState.load()`` runs in a worker thread at startup (GET /health answers 503
until it is done); HTTP handlers read ``engine`` only after ``ready``. The engine itself is
imported lazily so importing the gateway never imports torch.
"""
from __future__ import annotations

import fnmatch
import gc
import logging
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable

from radixgate.gateway.auth import ADMIN_TENANT, KeyRing, RateLimiter
from radixgate.gateway.config import GatewayConfig, ModelSettings
from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.metrics import GatewayMetrics
from radixgate.gateway.model_names import model_names
from radixgate.gateway.prepare import PrepareGate
from radixgate.gateway.diagnostics import DiagnosticsBook, diagnostics_file
from radixgate.gateway.usage_book import UsageBook
from radixgate.plural import plural

if TYPE_CHECKING:       # the runtime is imported lazily: importing the gateway never loads torch
    from radixgate.runtime.engine.client import EngineClient

log = logging.getLogger("radixgate.gateway")
DRAIN_RETRY_AFTER_S = 5.0

# (config) -> a started engine: the in-process Engine or a ClusterEngine. Tests pass one
# that reuses a loaded model.
EngineFactory = Callable[[GatewayConfig], "EngineClient"]


def default_engine_factory(config: GatewayConfig) -> EngineClient:
    """Loads the configured model and starts an Engine sized by the config; with
    ``[cluster]`` replicas, starts them on Ray Serve instead (radixgate/gateway/scaleout.py)."""
    if config.cluster.enabled:
        from radixgate.gateway.scaleout import start_cluster_engine
        return start_cluster_engine(config, engine_config(config))
    from radixgate.runtime.engine.engine import Engine
    from radixgate.kv.tiers.disk import check_disk_folder
    from radixgate.runtime.model.loader import load_model
    check_disk_folder(config.cache)        # a clear error before the model loads
    loaded = load_model(config.model.path, tiny=config.model.tiny,
                        max_model_len=config.model.max_model_len,
                        weights_dtype=config.model.weights_dtype)
    return Engine(loaded, engine_config(config)).start()


def early_engine_factory(config: GatewayConfig) -> EngineFactory:
    """Starts ``default_engine_factory(config)`` now, on a thread of its own, and returns a
    factory that hands over its engine (or raises its error): ``serve`` calls it before
    importing the web stack and building the app, which then overlap the load (start to
    healthy: the load starts ~0.35 s sooner). An engine nobody collects (the server
    failed to start) is shut down with the process. Not for replicas: Ray Serve starts them
    from the app's worker thread (started here, every cluster test's server died)."""
    result: Future = Future()

    def load() -> None:
        try:
            result.set_result(default_engine_factory(config))
        except BaseException as e:  # noqa: BLE001 - handed to whoever collects the engine
            result.set_exception(e)

    threading.Thread(target=load, name="radixgate-early-load", daemon=True).start()

    def collect(collected_config: GatewayConfig) -> EngineClient:
        if collected_config is not config:
            raise ValueError("the early engine was loaded for another config")
        return result.result()
    return collect


def engine_config(config: GatewayConfig):
    """The engine's config; with ``[server] kv_events_endpoint`` its KV events go there."""
    from radixgate.runtime.engine.engine_config import EngineConfig, TenantQuota
    quotas = {t.name: TenantQuota(max_running=t.max_running, max_pinned_tokens=t.max_pinned_tokens,
                                  max_queued=config.queue_share(t),
                                  max_namespaces=t.max_namespaces)
              for t in config.tenants}
    quotas[ADMIN_TENANT] = TenantQuota()
    return EngineConfig(cache=config.cache,
                        max_model_len=config.model.max_model_len,
                        max_queue=config.server.max_queue, tenant_quotas=quotas,
                        deterministic=config.model.deterministic, spec=config.spec,
                        max_unsent_events=config.server.max_unsent_events,
                        kv_events_endpoint=config.server.kv_events_endpoint or None,
                        kv_events_allow_remote=config.server.kv_events_allow_remote,
                        kv_events_replay_endpoint=config.server.kv_events_replay_endpoint or None)


def _warm_up(tokenizer) -> None:
    """Builds the tokenizer's lazily made parts now: the plain-text backend takes ~130 ms of
    native code that holds the GIL, which would stall every request in flight when the
    first request needed it (a thread beside the model's build gained nothing: both hold
    the GIL)."""
    tokenizer.warm_up()


def _freeze_startup_objects() -> None:
    """Moves everything allocated while loading (tokenizer tables, vocabularies, model
    objects: millions of them) out of the cyclic garbage collector's reach. Without it, a
    full collection, which any tenant's large request can set off, walks them all and
    stalls every request of every tenant for about 100 ms. No collection first: it found
    124 unreachable objects after a default load (0 bytes of RSS) and cost 95 ms of start."""
    gc.freeze()


class GatewayState:
    def __init__(self, config: GatewayConfig, engine_factory: EngineFactory | None = None):
        self.config = config
        self.keyring = KeyRing(config)
        self.limiter = RateLimiter()
        self.book = UsageBook.for_config(config)
        self.diagnostics = DiagnosticsBook(path=diagnostics_file(config))   # diagnostics.py
        self.engine: EngineClient | None = None
        self.ready = False
        self.draining = False
        self.load_error: str | None = None
        self.model_name = config.model.name
        self.model_names: tuple[str, ...] = ()     # the model's other names, once loaded
        self.metrics = GatewayMetrics(self.snapshot, lambda: self.model_name)
        self.prepare_gate = PrepareGate()
        self.load_done = threading.Event()     # set when load() ends, ready or failed
        self.grammars = None    # radixgate/gateway/constraints.py: compiled grammars, made at first use
        self._factory = engine_factory or default_engine_factory

    # -- lifecycle (worker thread) --------------------------------------------------------
    def load(self) -> None:
        start = time.perf_counter()
        try:
            self.engine = self._factory(self.config)
        except Exception as e:  # noqa: BLE001 - reported by /health, logged here
            log.exception("model load failed")
            self.load_error = f"{type(e).__name__}: {e}"
            return
        finally:
            self.load_done.set()
        info = self.engine.model_info
        if self.config.model.path != "default" and self.config.model.name == ModelSettings().name:
            self.model_name = info.name         # another model, served under its own name
        self.model_names = model_names(info.path)
        _warm_up(self.engine.tokenizer)
        _freeze_startup_objects()
        self.ready = True
        log.info("engine ready: model %s (%s), %s of %s, context %d, in %.1f s",
                 self.model_name, info.name, plural(self.engine.num_blocks, "KV block"),
                 plural(self.engine.block_size, "token"), self.engine.max_model_len,
                 time.perf_counter() - start)

    def shutdown(self, grace_s: float) -> None:
        if self.engine is not None:
            self.engine.shutdown(grace_s=grace_s)
        self.book.flush()          # the per-day usage ledger, to the state folder
        self.diagnostics.save()

    # -- helpers for handlers -------------------------------------------------------------
    def require_engine(self) -> EngineClient:
        """The engine, or a 503 while loading, after a failed load or while draining."""
        if self.draining:
            raise ApiError(Kind.UNAVAILABLE, "the server is shutting down; retry on another "
                           "replica or shortly", retry_after_s=DRAIN_RETRY_AFTER_S)
        if not self.ready:
            message = (f"model failed to load: {self.load_error}" if self.load_error
                       else "the model is still loading; retry shortly")
            raise ApiError(Kind.UNAVAILABLE, message)
        return self.engine

    def snapshot(self):
        return self.engine.snapshot() if self.ready else None

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def resolve_model(self, name: str | None) -> str:
        """The served model id for ``name``: its id, an alias glob, its Hugging Face id or
        file name (radixgate/gateway/model_names.py), or None (an OpenAI request that names no
        model); 404 otherwise."""
        if name is None or name == self.model_name or name in self.model_names or any(
                fnmatch.fnmatchcase(name, pattern) for pattern in self.config.model.aliases):
            return self.model_name
        raise ApiError(Kind.NOT_FOUND, f"model: {name} (this server serves "
                       f"{self.model_name!r}; aliases {list(self.config.model.aliases)})",
                       param="model", code="model_not_found")

    def preparing(self, principal):
        """``async with state.preparing(principal):`` one of the tenant's slots for reading,
        parsing and rendering a request (radixgate/gateway/prepare.py); 429 when too many wait."""
        limits = principal.limits
        if principal.tenant not in self.keyring.tenants:      # admin / open server
            return self.prepare_gate.slot(principal.tenant, 1 << 20, 1 << 20)
        return self.prepare_gate.slot(principal.tenant, limits.max_preparing,
                                      self.config.queue_share(limits))

    def check_rate(self, principal) -> None:
        wait = self.limiter.try_acquire(principal.tenant, principal.limits.requests_per_minute)
        if wait is not None:
            self.book.record_rejected(principal.tenant)
            raise ApiError(Kind.RATE_LIMIT, f"tenant {principal.tenant!r} is over its limit of "
                           f"{principal.limits.requests_per_minute} requests per minute",
                           retry_after_s=wait)
