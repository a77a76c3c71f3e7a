"""``EngineClient``: what the gateway uses of an engine, one contract for the in-process
``engine.Engine`` and the gateway's ``cluster.client.ClusterEngine`` (N replicas on Ray
Serve), checked against both by tests/test_engine_client_contract.py.

Every command returns a ``concurrent.futures.Future`` (wrap it with
``asyncio.wrap_future``); a request's events come from ``submit``'s ``RequestStream``:
``TextDelta`` ... then exactly one ``Finished`` (an error or a refusal is a ``Finished``
with ``error_kind``, never an exception). ``model_info`` says what the gateway needs of the
model (tokenizer, name, path, vocabulary, context) whether or not the weights are in this
process.
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol, Sequence, runtime_checkable

from radixgate.kv import PUBLIC_NAMESPACE
from radixgate.runtime.model.model_info import ModelInfo
from radixgate.runtime.model.tokenizer import Tokenizer

from .api import Event, Request
from .snapshot import EngineSnapshot


@runtime_checkable
class RequestStream(Protocol):
    """One request's events: ``async for event in stream``; ``abort()`` is idempotent and
    ends it with a Finished(aborted) when it had not finished."""

    def __aiter__(self) -> "RequestStream": ...
    async def __anext__(self) -> Event: ...
    def abort(self) -> None: ...


@runtime_checkable
class EngineClient(Protocol):
    tokenizer: Tokenizer
    model_info: ModelInfo
    block_size: int
    num_blocks: int          # per engine (a replica's, for N)
    max_model_len: int

    def submit(self, request: Request) -> RequestStream: ...
    def snapshot(self) -> EngineSnapshot: ...
    def request_snapshot(self) -> Future: ...          # Future[EngineSnapshot], taken now
    def flush(self, namespace: str | None = None) -> Future: ...      # Future[freed blocks]
    def holds_namespace(self, namespace: str) -> Future: ...          # Future[bool]
    def pin(self, namespace: str, tokens: Sequence[int], ttl_s: float,
            owner: str = "") -> Future: ...            # Future[pinned length]
    def unpin(self, namespace: str, tokens: Sequence[int]) -> Future: ...   # Future[bool]
    def publish(self, tokens: Sequence[int], ttl_s: float, namespace: str = PUBLIC_NAMESPACE,
                owner: str = PUBLIC_NAMESPACE) -> Future: ...      # Future[Finished]
    def expect_continuation(self, namespace: str, tokens: Sequence[int]) -> Future: ...
    def check_integrity(self) -> Future: ...            # Future[dict]
    def shutdown(self, grace_s: float = 10.0) -> None: ...
