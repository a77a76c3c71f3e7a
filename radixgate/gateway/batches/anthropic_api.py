"""Anthropic's Message Batches: POST/GET /v1/messages/batches, GET /v1/messages/batches/{id},
POST .../cancel, DELETE, GET .../results (JSONL, streamed).

A batch holds up to ``MAX_REQUESTS`` requests, each ``{"custom_id", "params"}`` with the
params of a Messages request (``stream`` is refused per request). A bad request gets its own
``errored`` result; the batch goes on. The batch object is Anthropic's: ``processing_status``
``in_progress`` -> ``canceling`` -> ``ended``, ``request_counts`` (processing, succeeded,
errored, canceled, expired), RFC 3339 times, ``results_url`` once ended. Requests run below
interactive traffic, grouped by prompt (runner.py); results are kept 29 days (store.py).
A tenant sees only its own batches (another's id is a 404).
"""
from __future__ import annotations

import datetime as dt
import json
import re

from aiohttp import web
from pydantic import ValidationError

from radixgate.gateway.anthropic.cache_diagnostics import batch_fields
from radixgate.gateway.anthropic.convert import convert_messages_request
from radixgate.gateway.anthropic.messages import message_body
from radixgate.gateway.anthropic.schemas import MessagesRequest
from radixgate.gateway.batches.execute import GroupPins, principal_for, run_request
from radixgate.gateway.batches.runner import BatchApi, prompt_key
from radixgate.gateway.batches.store import MAX_REQUESTS, Batch, QuotaExceeded
from radixgate.gateway.errors import Api, ApiError, Kind
from radixgate.gateway.http_util import (principal_of, read_json, state_of,
                                         validation_message)

CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_BATCH_BYTES = 64 << 20      # a batch's body (the server's max_body_bytes is for requests)
BATCHES = web.AppKey("batch_state", dict)     # {"store": BatchStore, "runner": BatchRunner}


def rfc3339(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat().replace("+00:00", "Z")


# -- the work ----------------------------------------------------------------------------
def anthropic_api(state, pins: GroupPins | None = None) -> BatchApi:
    async def execute(batch: Batch, line: dict) -> tuple[str, dict]:
        try:
            return "succeeded", await run_message(state, batch, line, pins)
        except ApiError as error:
            return "errored", {"result": {"type": "errored", "error": error.body(Api.ANTHROPIC)}}
    return BatchApi(execute, ended, group_key)


def ended(outcome: str, line: dict) -> dict:
    if outcome == "errored":
        error = ApiError(Kind.INTERNAL, "internal error while running this request")
        return {"result": {"type": "errored", "error": error.body(Api.ANTHROPIC)}}
    return {"result": {"type": outcome}}


def group_key(line: dict) -> str:
    return prompt_key(line, ("tools", "system", "messages"))


async def run_message(state, batch: Batch, line: dict, pins: GroupPins | None = None) -> dict:
    """One request of a batch as POST /v1/messages answers it, at batch priority; the
    answer as Anthropic's ``succeeded`` result."""
    try:
        body = MessagesRequest.model_validate(line["params"])
    except ValidationError as e:
        raise ApiError(Kind.BAD_REQUEST,
                       "params: " + validation_message(e, MessagesRequest)) from None
    if body.stream:
        raise ApiError(Kind.BAD_REQUEST, "params.stream: a batch request cannot stream")
    state.resolve_model(body.model)
    principal = principal_for(state, batch.tenant, bool(batch.extra.get("admin")))
    converted = convert_messages_request(body)
    request_id = f"{batch.id}-{line['custom_id']}"
    finished = await run_request(state, principal, request_id, converted, body,
                                 max_tokens=body.max_tokens, stop=body.stop_sequences,
                                 cache_salt=body.cache_salt, pins=pins)
    message = message_body("msg_" + request_id.replace("-", "_")[-24:], body.model,
                           converted, finished, batch_fields(body))
    return {"result": {"type": "succeeded", "message": message}}


# -- the routes --------------------------------------------------------------------------
def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/messages/batches", create)
    app.router.add_get("/v1/messages/batches", list_batches)
    app.router.add_get("/v1/messages/batches/{id}", retrieve)
    app.router.add_post("/v1/messages/batches/{id}/cancel", cancel)
    app.router.add_delete("/v1/messages/batches/{id}", delete)
    app.router.add_get("/v1/messages/batches/{id}/results", results)


def batch_body(request: web.Request, batch: Batch) -> dict:
    status = batch.status
    url = None
    if status == "ended":
        url = f"{request.url.origin()}/v1/messages/batches/{batch.id}/results"
    counts = dict(batch.counts, processing=batch.processing)
    return {"id": batch.id, "type": "message_batch", "processing_status": status,
            "request_counts": {k: counts[k] for k in ("processing", "succeeded", "errored",
                                                       "canceled", "expired")},
            "ended_at": rfc3339(batch.ended_at), "created_at": rfc3339(batch.created_at),
            "expires_at": rfc3339(batch.expires_at), "archived_at": None,
            "cancel_initiated_at": rfc3339(batch.cancel_initiated_at), "results_url": url}


def _batches(request: web.Request) -> dict:
    return request.app[BATCHES]


def check_quota(store, tenant: str, adding: int) -> None:
    """The tenant's batch limits as the API's 429."""
    try:
        store.check_room(tenant, adding)
    except QuotaExceeded as exc:
        raise ApiError(Kind.RATE_LIMIT, str(exc)) from None


def _own(request: web.Request) -> Batch:
    batch = _batches(request)["store"].get(principal_of(request).tenant,
                                           request.match_info["id"])
    if batch is None or batch.api != "anthropic":
        raise ApiError(Kind.NOT_FOUND, f"message batch {request.match_info['id']!r} not found")
    return batch


def _lines(data) -> list[dict]:
    """The ``requests`` of a create body, checked (custom ids; params are checked when each
    request runs, so one bad request fails alone)."""
    requests = data.get("requests") if isinstance(data, dict) else None
    if not isinstance(requests, list) or not requests:
        raise ApiError(Kind.BAD_REQUEST, "requests: a non-empty list is required",
                       param="requests")
    if len(requests) > MAX_REQUESTS:
        raise ApiError(Kind.BAD_REQUEST, f"requests: at most {MAX_REQUESTS} a batch",
                       param="requests")
    seen: set[str] = set()
    for i, item in enumerate(requests):
        custom_id = item.get("custom_id") if isinstance(item, dict) else None
        if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
            raise ApiError(Kind.BAD_REQUEST, f"requests.{i}.custom_id: 1 to 64 letters, "
                           "digits, '-' or '_'", param=f"requests.{i}.custom_id")
        if custom_id in seen:
            raise ApiError(Kind.BAD_REQUEST, f"requests.{i}.custom_id: {custom_id!r} is used "
                           "twice", param=f"requests.{i}.custom_id")
        if not isinstance(item.get("params"), dict):
            raise ApiError(Kind.BAD_REQUEST, f"requests.{i}.params: an object is required",
                           param=f"requests.{i}.params")
        seen.add(custom_id)
    return [{"custom_id": r["custom_id"], "params": r["params"]} for r in requests]


async def create(request: web.Request) -> web.Response:
    principal, state = principal_of(request), state_of(request)
    request = request.clone(client_max_size=max(MAX_BATCH_BYTES, request.client_max_size))
    lines = _lines(await read_json(request))
    store = _batches(request)["store"]
    check_quota(store, principal.tenant, len(lines))
    state.check_rate(principal)
    batch = store.create("anthropic", principal.tenant, lines,
                         extra={"admin": principal.is_admin})
    _batches(request)["runner"].add(batch)
    return web.json_response(batch_body(request, batch))


async def retrieve(request: web.Request) -> web.Response:
    return web.json_response(batch_body(request, _own(request)))


async def list_batches(request: web.Request) -> web.Response:
    query = request.query
    try:
        limit = min(1000, max(1, int(query.get("limit", 20))))
    except ValueError:
        raise ApiError(Kind.BAD_REQUEST, "limit must be a number", param="limit") from None
    batches = _batches(request)["store"].list(principal_of(request).tenant, "anthropic")
    ids = [b.id for b in batches]
    start = ids.index(query["after_id"]) + 1 if query.get("after_id") in ids else 0
    if query.get("before_id") in ids:
        end = ids.index(query["before_id"])
        start = max(0, end - limit)
        page = batches[start:end]
    else:
        page = batches[start:start + limit]
    more = start + len(page) < len(batches) if "before_id" not in query else start > 0
    return web.json_response({"data": [batch_body(request, b) for b in page], "has_more": more,
                              "first_id": page[0].id if page else None,
                              "last_id": page[-1].id if page else None})


async def cancel(request: web.Request) -> web.Response:
    batch = _own(request)
    if batch.status == "in_progress":
        _batches(request)["runner"].cancel(batch)
    return web.json_response(batch_body(request, batch))


async def delete(request: web.Request) -> web.Response:
    batch = _own(request)
    if batch.status != "ended":
        raise ApiError(Kind.BAD_REQUEST, "a message batch can be deleted only once it has "
                       "ended: cancel it first")
    _batches(request)["store"].delete(batch)
    return web.json_response({"id": batch.id, "type": "message_batch_deleted"})


async def results(request: web.Request) -> web.StreamResponse:
    batch = _own(request)
    if batch.status != "ended":
        raise ApiError(Kind.BAD_REQUEST, f"message batch {batch.id} has not ended: its "
                       "results are ready once processing_status is ended")
    response = web.StreamResponse(headers={"Content-Type": "application/binary"})
    await response.prepare(request)
    for result in _batches(request)["store"].results(batch):
        line = {"custom_id": result["custom_id"], **result["body"]}
        await response.write((json.dumps(line, ensure_ascii=False) + "\n").encode())
    await response.write_eof()
    return response
