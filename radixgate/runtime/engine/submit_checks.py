"""Checks a request must pass at submission (engine thread: they read the tree and queue).

Each failure maps to an ``ErrorKind`` the gateway turns into an HTTP status:
BAD_REQUEST (empty prompt, unknown token ids, bad sampling values, duplicate id),
TOO_LONG (over the context window, or could never fit the KV budget minus pinned blocks),
OVERLOADED (draining, or the waiting queue is full), OVER_CAPACITY (tenant's queue quota).
"""
from __future__ import annotations

from .api import ErrorKind, Request
from .sampling import validate_sampling


def rejection(core, request: Request) -> tuple[ErrorKind, str] | None:
    """(kind, message) when ``request`` must be refused now, else None."""
    for check in (_check_state, _check_tokens, _check_sampling, _check_length, _check_queue):
        problem = check(core, request)
        if problem is not None:
            return problem
    return None


def _check_state(core, request: Request):
    if core.draining:
        return ErrorKind.OVERLOADED, "the engine is shutting down and admits no new requests"
    if request.request_id in core.sequences:
        return ErrorKind.BAD_REQUEST, f"request id {request.request_id!r} is already in use"
    return None


def _check_tokens(core, request: Request):
    if not request.tokens:
        return ErrorKind.BAD_REQUEST, "the prompt is empty"
    if min(request.tokens) < 0 or max(request.tokens) >= core.vocab_size:
        return ErrorKind.BAD_REQUEST, f"prompt token ids must lie in [0, {core.vocab_size})"
    return None


def _check_sampling(core, request: Request):
    message = validate_sampling(request.sampling, core.vocab_size)
    return (ErrorKind.BAD_REQUEST, message) if message else None


def _check_length(core, request: Request):
    prompt, new = len(request.tokens), request.sampling.max_tokens
    if prompt + new > core.max_model_len:
        return (ErrorKind.TOO_LONG, f"prompt ({prompt} tokens) + max_tokens ({new}) exceeds the "
                                    f"context window of {core.max_model_len} tokens")
    block_size = core.pool.block_size
    needed = -(-(prompt + new - 1) // block_size)   # the last sampled token needs no slot
    available = core.pool.num_blocks - core.tree.pinned_block_count()
    if needed > available:   # worded from the request and the capacity: pins are others' too
        return (ErrorKind.TOO_LONG, f"prompt ({prompt} tokens) + max_tokens ({new}) needs {needed} "
                                    f"KV blocks of {block_size} tokens, more than the KV cache "
                                    f"({core.pool.num_blocks} blocks, part of which pinned "
                                    f"prefixes may hold) can give one request")
    return None


def _check_queue(core, request: Request):
    if core.scheduler.num_waiting >= core.config.max_queue:
        return ErrorKind.OVERLOADED, f"the waiting queue is full ({core.config.max_queue} requests)"
    limit = core.config.quota_for(request.tenant).max_queued
    if limit is not None and core.scheduler.waiting_of(request.tenant) >= limit:
        return (ErrorKind.OVER_CAPACITY,
                f"tenant {request.tenant!r} already has {limit} requests waiting")
    return None
