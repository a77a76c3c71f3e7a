"""A request's work before the engine (read, parse, render, tokenize, count), bounded so
that no tenant can stall the others with it.

Every generation and count route runs, in this order:

1. the tenant's request-rate limit (``GatewayState.check_rate``), before the body is read;
2. one of the tenant's ``max_preparing`` slots (``PrepareGate``): reading, parsing and
   rendering happen inside it; while all are busy a request waits, and when the tenant
   already has its queue share of requests waiting it gets 429 at once;
3. a length bound that costs no tokenization: a prompt whose text alone needs more tokens
   than the context window leaves room for is refused (400) before rendering;
4. the render in a worker thread, which stops between segments once the request is gone
   (its handler was cancelled by a disconnect, or ``request_timeout_s`` passed) or once the
   prompt outgrows the room left in the context window (400 at once, not after the engine).
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.render import (Conversation, PromptTooLong, RenderAbandoned,
                                      RenderBudget, RenderedPrompt, TemplateError,
                                      render_prompt)


@dataclass
class _TenantSlots:
    semaphore: asyncio.Semaphore
    waiting: int = 0


class PrepareGate:
    """Per-tenant cap on requests being prepared at once, with a bounded wait."""

    def __init__(self):
        self._tenants: dict[str, _TenantSlots] = {}

    @contextlib.asynccontextmanager
    async def slot(self, tenant: str, limit: int, max_waiting: int):
        """Holds one of ``tenant``'s ``limit`` slots; raises ``ApiError(RATE_LIMIT)`` when all
        are busy and ``max_waiting`` requests of the tenant already wait for one."""
        slots = self._tenants.get(tenant)
        if slots is None:
            slots = self._tenants[tenant] = _TenantSlots(asyncio.Semaphore(limit))
        if slots.semaphore.locked() and slots.waiting >= max_waiting:
            raise ApiError(Kind.RATE_LIMIT, f"tenant {tenant!r} already has {limit} requests "
                           f"being prepared and {slots.waiting} waiting for that",
                           retry_after_s=1.0)
        slots.waiting += 1
        try:
            await slots.semaphore.acquire()
        finally:
            slots.waiting -= 1
        try:
            yield
        finally:
            slots.semaphore.release()


def room_for_prompt(max_model_len: int, max_tokens: int) -> int:
    """The most prompt tokens that leave ``max_tokens`` of the context window; 400 when
    ``max_tokens`` alone takes it all."""
    room = max_model_len - max_tokens
    if room < 1:
        raise ApiError(Kind.BAD_REQUEST, f"max_tokens ({max_tokens}) leaves no room for a prompt "
                       f"in the context window of {max_model_len} tokens", param="max_tokens")
    return room


def fewest_tokens(texts: Iterable[str], max_token_bytes: int | None) -> int:
    """A lower bound on the tokens ``texts`` encode to, each on its own: no token spans
    more than ``max_token_bytes`` UTF-8 bytes. 0 when the tokenizer does not say."""
    if not max_token_bytes:
        return 0
    return sum(-(-len(text.encode("utf-8", "surrogatepass")) // max_token_bytes)
               for text in texts)


def check_length_bound(texts: Iterable[str], tokenizer, room: int, reserved: int) -> None:
    """Refuses (400) a prompt whose text alone needs more than ``room`` tokens."""
    least = fewest_tokens(texts, getattr(tokenizer, "max_plain_token_bytes", None))
    if least > room:
        raise too_long(room, reserved, context=room + reserved, at_least=least)


class ContextExceeded(ApiError):
    """400: the prompt and the room kept for the answer (``reserved`` tokens) do not fit the
    context window; OpenAI's code ``context_length_exceeded``. The message names the
    ``max_tokens`` the client sent once the caller says it (``naming``): with clamping on
    (the default) only one answer token is reserved, which is not what the client asked."""

    def __init__(self, prompt: str, context: int, reserved: int, sent: int | None = None):
        self.prompt, self.context, self.reserved, self.sent = prompt, context, reserved, sent
        super().__init__(Kind.BAD_REQUEST, self._message(), code="context_length_exceeded")

    def naming(self, sent: int | None) -> "ContextExceeded":
        """The same error, naming the client's ``max_tokens`` (None: it sent none)."""
        return ContextExceeded(self.prompt, self.context, self.reserved, sent)

    def _message(self) -> str:
        head = f"prompt is too long: the prompt ({self.prompt})"
        window = f"the context window of {self.context} tokens"
        if not self.reserved:
            return f"{head} exceeds {window}"
        if self.sent == self.reserved or (self.sent is None and self.reserved > 1):
            return f"{head} + max_tokens ({self.reserved}) exceeds {window}"
        clamped = (f" (max_tokens {self.sent} is clamped to the room the prompt leaves)"
                   if self.sent is not None else "")
        return f"{head} leaves no room for an answer in {window}{clamped}"


def too_long(room: int, reserved: int, context: int, at_least: int | None = None
             ) -> ContextExceeded:
    size = f"at least {at_least} tokens" if at_least is not None else f"more than {room} tokens"
    return ContextExceeded(size, context, reserved)


def conversation_texts(conversation: Conversation) -> list[str]:
    """The client's own text of every piece (what the length bound counts)."""
    pieces = [*conversation.system, *conversation.prefill]
    for message in conversation.messages:
        pieces.extend(message.pieces)
    return [piece.text for piece in pieces]


async def render_bounded(tokenizer, conversation: Conversation, *, room: int, reserved: int,
                         timeout_s: float, on_template_render: Callable[[], None] | None = None
                         ) -> RenderedPrompt:
    """``render_prompt`` in a worker thread (the length bound first, there too: it encodes
    every piece's text, which for a large body is no work for the event loop), within the
    room and the timeout; abandoned (the thread stops at its next segment) when the
    awaiting handler is cancelled."""

    def render(cancelled: Callable[[], bool]) -> RenderedPrompt:
        check_length_bound(conversation_texts(conversation), tokenizer, room, reserved)
        return render_prompt(tokenizer, conversation, RenderBudget(
            max_tokens=room, cancelled=cancelled, on_template_render=on_template_render))

    return await run_abandonable(render, timeout_s=timeout_s, room=room, reserved=reserved)


async def run_abandonable(work: Callable[[Callable[[], bool]], RenderedPrompt], *,
                          timeout_s: float, room: int, reserved: int) -> RenderedPrompt:
    """Runs ``work(cancelled)`` in a thread; ``cancelled()`` turns true once the handler
    is cancelled or ``timeout_s`` passed. Maps render failures to API errors."""
    gone = threading.Event()
    deadline = time.monotonic() + timeout_s

    def cancelled() -> bool:
        return gone.is_set() or time.monotonic() > deadline

    try:
        return await asyncio.to_thread(work, cancelled)
    except TemplateError as e:
        raise ApiError(Kind.BAD_REQUEST, str(e)) from None
    except PromptTooLong:
        raise too_long(room, reserved, context=room + reserved) from None
    except RenderAbandoned:
        raise ApiError(Kind.TIMEOUT, f"preparing the prompt took longer than {timeout_s:g} s"
                       ) from None
    finally:
        gone.set()
