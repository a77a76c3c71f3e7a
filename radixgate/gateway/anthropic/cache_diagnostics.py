"""Anthropic's cache diagnostics on POST /v1/messages.

A request with ``diagnostics: {"previous_message_id": "msg_..."}`` gets
``diagnostics.cache_miss_reason``: where its prompt first departs from that earlier request's,
named as Anthropic's API names it. The comparison is structural (whatever the cache then
read), made at admission, so a stream's ``message_start`` carries it too. It is built on the
diagnostics records (gateway/diagnostics.py): each prompt's labelled parts in render order
(the tools, the system blocks, the messages, the generation prompt) with a digest of each
part's tokens.

- ``model_changed``: the request names another model;
- ``tools_changed`` / ``system_changed`` / ``messages_changed``: the first differing part is
  a tool (or the tool list's header), a system block, or a message; messages appended after
  the earlier request's are no change;
- ``unavailable``: model, tools, system and messages agree but the cache namespace differs
  (another ``cache_salt``); a Message Batches request always answers it (no record is kept);
- ``previous_message_not_found``: no recent Messages request with that id in the caller's
  tenant (another tenant's id reads as unknown); records are kept as long as
  ``/v1/cache/diagnostics`` keeps them.

Each ``*_changed`` reason carries ``cache_missed_input_tokens``: the earlier prompt's tokens
from the first differing part up to its generation prompt (no more than this prompt's
length), what the cache could have read had the prefix matched. ``diagnostics`` is ``null``
on a first turn (``previous_message_id`` null) and where nothing diverged, and absent when
the request has no ``diagnostics``.
"""
from __future__ import annotations

from radixgate.gateway.diagnostics import Part, Record
from radixgate.gateway.diagnostics_api import request_id_from

NOT_FOUND = {"type": "previous_message_not_found"}
UNAVAILABLE = {"type": "unavailable"}
GENERATION_PROMPT = "generation prompt"


def response_fields(admitted) -> dict:
    """The answer's ``{"diagnostics": ...}`` (``{}`` when the request asked for none).
    Notes the model the request named on its record first, for later comparisons."""
    record: Record | None = admitted.generation.diagnostics
    if record is not None:
        record.model = admitted.body.model
    wanted = admitted.body.diagnostics
    if wanted is None:
        return {}
    if wanted.previous_message_id is None:
        return {"diagnostics": None}
    if record is None:
        return {"diagnostics": {"cache_miss_reason": UNAVAILABLE}}
    previous = admitted.state.diagnostics.find(admitted.principal.tenant,
                                               request_id_from(wanted.previous_message_id))
    reason = cache_miss_reason(previous, record)
    return {"diagnostics": None if reason is None else {"cache_miss_reason": reason}}


def batch_fields(body) -> dict:
    """A Message Batches answer's ``{"diagnostics": ...}``: batch requests keep no record,
    so a previous message is never compared (``unavailable``)."""
    wanted = body.diagnostics
    if wanted is None:
        return {}
    if wanted.previous_message_id is None:
        return {"diagnostics": None}
    return {"diagnostics": {"cache_miss_reason": UNAVAILABLE}}


def cache_miss_reason(previous: Record | None, current: Record) -> dict | None:
    """Why ``current`` could not reuse ``previous``'s prefix; None where nothing diverged."""
    if previous is None or previous.model is None:
        return NOT_FOUND
    if previous.model != current.model:
        return _missed("model_changed", previous, current, 0)
    at = _first_difference(previous.parts, current.parts)
    if at is None:
        return None if previous.namespace == current.namespace else UNAVAILABLE
    labels = [parts[at].label for parts in (previous.parts, current.parts) if at < len(parts)]
    return _missed(_kind(labels), previous, current, previous.parts[at].start)


def _first_difference(previous: tuple[Part, ...], current: tuple[Part, ...]) -> int | None:
    """The index of the first of ``previous``'s parts (its generation prompt aside) that
    ``current`` does not repeat in place; None when it repeats them all."""
    for i, part in enumerate(previous):
        if part.label == GENERATION_PROMPT:
            return None
        if i >= len(current) or (current[i].label, current[i].digest) != (part.label,
                                                                            part.digest):
            return i
    return None


def _kind(labels: list[str]) -> str:
    """The reason for a difference at parts labelled ``labels`` (each side's, in cache
    order: tools first, then system, then messages)."""
    if any(label.startswith("tool") for label in labels):       # "tools header", "tool 2"
        return "tools_changed"
    if any(label.startswith("system") for label in labels):     # "system block 0"
        return "system_changed"
    return "messages_changed"


def _missed(kind: str, previous: Record, current: Record, start: int) -> dict:
    end = next((p.start for p in previous.parts if p.label == GENERATION_PROMPT),
               previous.prompt_tokens)
    missed = max(0, min(end, current.prompt_tokens) - start)
    return {"type": kind, "cache_missed_input_tokens": missed}
