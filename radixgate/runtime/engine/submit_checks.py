"""Checks a request must pass at submission (engine thread: they read the tree and queue).

Each failure maps to an ``ErrorKind`` the gateway turns into an HTTP status:
BAD_REQUEST (empty prompt, unknown token ids, bad sampling values, duplicate id),
TOO_LONG (over the context window, or could never fit the KV budget minus pinned blocks),
OVERLOADED (draining, or the waiting queue is full), OVER_CAPACITY (tenant's queue quota).

The checks read a ``SubmitView`` (the engine core builds one), never the core itself: the
fixed numbers in ``SubmitLimits`` and the live ones through the view's functions, each
called only when its check is reached.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .api import ErrorKind, Request
from .sampling import validate_sampling


@dataclass(frozen=True, slots=True)
class SubmitLimits:
    """What does not change while the engine runs."""

    vocab_size: int          # the logits' width: token ids lie in [0, vocab_size)
    context_len: int         # prompt + max_tokens may not exceed it
    block_size: int          # tokens per KV block
    num_blocks: int          # KV blocks of the main pool
    max_queue: int           # waiting requests, all tenants together


@dataclass(frozen=True, slots=True)
class SubmitView:
    """What the submit checks read: ``limits`` and the live state, each a function of the
    engine thread's state (call them on that thread only)."""

    limits: SubmitLimits
    draining: Callable[[], bool]                 # the engine admits no new requests
    in_use: Callable[[str], bool]                # a live request has this id
    pinned_blocks: Callable[[], int]             # blocks on paths to unexpired pins
    waiting: Callable[[], int]                   # waiting requests, all tenants
    waiting_of: Callable[[str], int]             # waiting requests of a tenant
    queue_quota: Callable[[str], int | None]     # a tenant's max_queued (None: no limit)


def rejection(view: SubmitView, request: Request) -> tuple[ErrorKind, str] | None:
    """(kind, message) when ``request`` must be refused now, else None."""
    for check in (_check_state, _check_tokens, _check_sampling, _check_length, _check_queue):
        problem = check(view, request)
        if problem is not None:
            return problem
    return None


def _check_state(view: SubmitView, request: Request):
    if view.draining():
        return ErrorKind.OVERLOADED, "the engine is shutting down and admits no new requests"
    if view.in_use(request.request_id):
        return ErrorKind.BAD_REQUEST, f"request id {request.request_id!r} is already in use"
    return None


def _check_tokens(view: SubmitView, request: Request):
    vocab_size = view.limits.vocab_size
    if not request.tokens:
        return ErrorKind.BAD_REQUEST, "the prompt is empty"
    if min(request.tokens) < 0 or max(request.tokens) >= vocab_size:
        return ErrorKind.BAD_REQUEST, f"prompt token ids must lie in [0, {vocab_size})"
    return None


def _check_sampling(view: SubmitView, request: Request):
    message = validate_sampling(request.sampling, view.limits.vocab_size)
    return (ErrorKind.BAD_REQUEST, message) if message else None


def _check_length(view: SubmitView, request: Request):
    limits = view.limits
    prompt, new = len(request.tokens), request.sampling.max_tokens
    if prompt + new > limits.context_len:
        return (ErrorKind.TOO_LONG, f"prompt ({prompt} tokens) + max_tokens ({new}) exceeds the "
                                    f"context window of {limits.context_len} tokens")
    block_size = limits.block_size
    needed = -(-(prompt + new - 1) // block_size)   # the last sampled token needs no slot
    available = limits.num_blocks - view.pinned_blocks()
    if needed > available:   # worded from the request and the capacity: pins are others' too
        return (ErrorKind.TOO_LONG, f"prompt ({prompt} tokens) + max_tokens ({new}) needs {needed} "
                                    f"KV blocks of {block_size} tokens, more than the KV cache "
                                    f"({limits.num_blocks} blocks, part of which pinned "
                                    f"prefixes may hold) can give one request")
    return None


def _check_queue(view: SubmitView, request: Request):
    max_queue = view.limits.max_queue
    if view.waiting() >= max_queue:
        return ErrorKind.OVERLOADED, f"the waiting queue is full ({max_queue} requests)"
    limit = view.queue_quota(request.tenant)
    if limit is not None and view.waiting_of(request.tenant) >= limit:
        return (ErrorKind.OVER_CAPACITY,
                f"tenant {request.tenant!r} already has {limit} requests waiting")
    return None
