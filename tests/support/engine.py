"""In-process engine helpers for the fault and scheduling tests (no HTTP)."""
from __future__ import annotations

import asyncio
import contextlib
import functools

from radixgate.kv import CacheConfig
from radixgate.runtime.engine.api import Finished, Request, SamplingParams, TextDelta
from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.engine.engine_config import EngineConfig

CACHE_FIELDS = frozenset(CacheConfig.__dataclass_fields__)


@functools.lru_cache(maxsize=1)
def tiny_model():
    """One seeded tiny model per test process (immutable once built)."""
    from radixgate.runtime.model.loader import load_model
    return load_model(tiny=True, max_model_len=1024)


def engine_config(**fields) -> EngineConfig:
    """``EngineConfig(**fields)``, where the cache's own fields (``block_size``,
    ``enable_prefix_cache``, ``policy``, ...) may be given beside the engine's: they go
    into ``cache=CacheConfig(...)``. 128 blocks unless ``num_blocks`` is given."""
    cache = {name: fields.pop(name) for name in list(fields) if name in CACHE_FIELDS}
    fields.setdefault("num_blocks", 128)
    return EngineConfig(cache=CacheConfig(**cache), **fields)


@contextlib.contextmanager
def running_engine(**config):
    """A started ``Engine`` over the tiny model (``engine_config(**config)``); shut down
    (grace 0) on exit."""
    engine = Engine(tiny_model(), engine_config(**config)).start()
    try:
        yield engine
    finally:
        engine.shutdown(grace_s=0)


def request(tokens: list[int], tenant: str = "acme", namespace: str | None = None,
            max_tokens: int = 4, ignore_eos: bool = True) -> Request:
    return Request(list(tokens), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                ignore_eos=ignore_eos),
                   tenant=tenant, namespace=namespace or f"ns-{tenant}")


async def first_delta(handle) -> TextDelta | Finished:
    """Wait for the handle's first event (the request is running once a delta arrives)."""
    return await asyncio.wait_for(handle.__anext__(), timeout=60)


async def finish(handle, timeout_s: float = 120) -> Finished:
    return await asyncio.wait_for(handle.result(), timeout=timeout_s)


def integrity(engine: Engine) -> dict:
    """check_integrity() through the engine's command queue (raises on a mismatch)."""
    return engine.check_integrity().result(timeout=30)


def wait_idle(engine: Engine) -> dict:
    """A fresh snapshot taken between steps once nothing runs; returns integrity counts."""
    engine.request_snapshot().result(timeout=30)
    return integrity(engine)
