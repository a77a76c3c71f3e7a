"""OpenAI's Files (purpose ``batch``) and Batch APIs: POST /v1/files, GET /v1/files/{id},
GET /v1/files/{id}/content, DELETE /v1/files/{id}; POST /v1/batches, GET /v1/batches,
GET /v1/batches/{id}, POST /v1/batches/{id}/cancel.

An input file is JSONL, one ``{"custom_id", "method": "POST", "url", "body"}`` a line, at
most ``MAX_FILE_BYTES``; a batch runs it against its ``endpoint`` (``/v1/chat/completions``,
``/v1/completions`` (one prompt a line), ``/v1/responses`` (first turns, not stored);
``completion_window`` 24h). A line that does not parse, names another endpoint or has a bad
body gets its own line in the error file; the batch goes on. The output and error files are
read from the batch's stored results (``file-out-<batch>``, ``file-err-<batch>``), each line
OpenAI's ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``.
Statuses: in_progress, cancelling, then completed, cancelled or expired; ``request_counts``
total / completed / failed. A tenant sees only its own files and batches.
"""
from __future__ import annotations

import json
import secrets
import time

from aiohttp import web
from pydantic import ValidationError

from radixgate.gateway.batches.anthropic_api import BATCHES, check_quota
from radixgate.gateway.batches.execute import GroupPins, principal_for, run_request
from radixgate.gateway.batches.runner import BatchApi, prompt_key
from radixgate.gateway.batches.store import MAX_REQUESTS, Batch
from radixgate.gateway.errors import Api, ApiError, Kind
from radixgate.gateway.http_util import principal_of, read_json, state_of, validation_message
from radixgate.gateway.constraint_fields import openai_constraint
from radixgate.gateway.openai.chat import chat_body
from radixgate.gateway.openai.choices import batched_usage
from radixgate.gateway.openai.completions import completion_choice, prompt_token_lists
from radixgate.gateway.prepare import room_for_prompt
from radixgate.gateway.service import reserved_for
from radixgate.gateway.openai.convert import convert_chat_request
from radixgate.gateway.openai.responses.api import ResponseBuilder, reject_unsupported
from radixgate.gateway.openai.responses.convert import convert_first_turn
from radixgate.gateway.openai.responses.schemas import ResponsesRequest
from radixgate.gateway.openai.schemas import ChatCompletionRequest, CompletionRequest
from radixgate.gateway.batches.store import tenant_key
from radixgate.gateway.state_dir import private_folder, write_private

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
MAX_FILE_BYTES = 100 << 20
STATUS = {"in_progress": "in_progress", "canceling": "cancelling"}


# -- the work ----------------------------------------------------------------------------
def openai_api(state, pins: GroupPins | None = None) -> BatchApi:
    async def execute(batch: Batch, line: dict) -> tuple[str, dict]:
        try:
            return "succeeded", await run_line(state, batch, line, pins)
        except ApiError as error:
            return "errored", error_line(line, error)
    return BatchApi(execute, ended, group_key)


def _line_id() -> str:
    return "batch_req_" + secrets.token_hex(12)


def error_line(line: dict, error: ApiError) -> dict:
    return {"id": _line_id(), "response": {"status_code": error.status(Api.OPENAI),
                                           "request_id": "", "body": error.body(Api.OPENAI)},
            "error": None}


def ended(outcome: str, line: dict) -> dict:
    if outcome == "errored":
        return error_line(line, ApiError(Kind.INTERNAL, "internal error while running this "
                                                        "request"))
    code = {"canceled": "batch_cancelled", "expired": "batch_expired"}[outcome]
    return {"id": _line_id(), "response": None,
            "error": {"code": code, "message": f"this request was not run: the batch was "
                                               f"{'cancelled' if outcome == 'canceled' else 'expired'}"}}


def group_key(line: dict) -> str:
    return prompt_key(line, ("tools", "instructions", "messages", "input", "prompt"))


async def run_line(state, batch: Batch, line: dict, pins: GroupPins | None = None) -> dict:
    if line.get("invalid"):
        raise ApiError(Kind.BAD_REQUEST, line["invalid"])
    if batch.extra["endpoint"] == "/v1/completions":
        return await run_completion(state, batch, line)
    if batch.extra["endpoint"] == "/v1/responses":
        return await run_response(state, batch, line, pins)
    return await run_chat(state, batch, line, pins)


async def run_response(state, batch: Batch, line: dict, pins: GroupPins | None = None) -> dict:
    """One /v1/responses request of a batch: a first turn (no ``previous_response_id``),
    unstreamed and not stored (the result line holds the response object)."""
    try:
        body = ResponsesRequest.model_validate(line["params"])
    except ValidationError as e:
        raise ApiError(Kind.BAD_REQUEST,
                       "body: " + validation_message(e, ResponsesRequest)) from None
    if body.stream or body.previous_response_id is not None:
        raise ApiError(Kind.BAD_REQUEST, "body: a batch response is one unstreamed first "
                       "turn (no previous_response_id)")
    reject_unsupported(body)
    state.resolve_model(body.model)
    principal = principal_for(state, batch.tenant, bool(batch.extra.get("admin")))
    turn = convert_first_turn(body)
    request_id = f"{batch.id}-{line['custom_id']}"
    finished = await run_request(state, principal, request_id, turn.converted, body,
                                 max_tokens=body.max_output_tokens, stop=None,
                                 cache_salt=body.cache_salt, pins=pins)
    builder = ResponseBuilder(body, turn)
    response = builder.final(finished, builder.output_items(finished))
    return {"id": _line_id(), "response": {"status_code": 200, "request_id": request_id,
                                           "body": response}, "error": None}


async def run_completion(state, batch: Batch, line: dict) -> dict:
    """One /v1/completions request of a batch: one prompt, one choice, unstreamed."""
    try:
        body = CompletionRequest.model_validate(line["params"])
    except ValidationError as e:
        raise ApiError(Kind.BAD_REQUEST,
                       "body: " + validation_message(e, CompletionRequest)) from None
    if body.stream or body.n != 1 or body.logprobs is not None or body.suffix:
        raise ApiError(Kind.BAD_REQUEST, "body: a batch completion runs one choice, "
                       "unstreamed, without logprobs or suffix")
    served = state.resolve_model(body.model)
    principal = principal_for(state, batch.tenant, bool(batch.extra.get("admin")))
    max_tokens = body.max_tokens or 16
    room = room_for_prompt(state.require_engine().max_model_len, reserved_for(state, max_tokens))
    token_lists = prompt_token_lists(state, body, room, reserved_for(state, max_tokens))
    if len(token_lists) != 1:
        raise ApiError(Kind.BAD_REQUEST, "body.prompt: one prompt a batch line")
    request_id = f"{batch.id}-{line['custom_id']}"
    finished = await run_request(state, principal, request_id, None, body,
                                 max_tokens=max_tokens, stop=body.stop,
                                 cache_salt=body.cache_salt, tokens=token_lists[0],
                                 constraint=openai_constraint(body))
    echo = state.tokenizer.decode(token_lists[0]) if body.echo else ""
    completion = {"id": "cmpl-" + secrets.token_hex(12), "object": "text_completion",
                  "created": int(time.time()), "model": body.model or served,
                  "choices": [completion_choice(0, finished, None, echo, [])],
                  "usage": batched_usage([finished], 1), "system_fingerprint": None}
    return {"id": _line_id(), "response": {"status_code": 200, "request_id": request_id,
                                           "body": completion}, "error": None}


async def run_chat(state, batch: Batch, line: dict, pins: GroupPins | None = None) -> dict:
    try:
        body = ChatCompletionRequest.model_validate(line["params"])
    except ValidationError as e:
        raise ApiError(Kind.BAD_REQUEST,
                       "body: " + validation_message(e, ChatCompletionRequest)) from None
    if body.stream or body.n != 1:
        raise ApiError(Kind.BAD_REQUEST, "body: a batch request runs one choice, unstreamed")
    served = state.resolve_model(body.model)
    principal = principal_for(state, batch.tenant, bool(batch.extra.get("admin")))
    converted = convert_chat_request(body)
    request_id = f"{batch.id}-{line['custom_id']}"
    finished = await run_request(state, principal, request_id, converted, body,
                                 max_tokens=body.max_completion_tokens or body.max_tokens,
                                 stop=body.stop, cache_salt=body.cache_salt, pins=pins)
    chat = chat_body("chatcmpl-" + secrets.token_hex(12), body.model or served, converted,
                     [finished])
    return {"id": _line_id(), "response": {"status_code": 200, "request_id": request_id,
                                           "body": chat}, "error": None}


# -- files -------------------------------------------------------------------------------
def _files_folder(request: web.Request, tenant: str):
    store = request.app[BATCHES]["store"]
    return private_folder(private_folder(store.root.parent, "files"), tenant_key(tenant))


def file_body(meta: dict) -> dict:
    return {"id": meta["id"], "object": "file", "bytes": meta["bytes"],
            "created_at": int(meta["created_at"]), "filename": meta["filename"],
            "purpose": meta["purpose"], "status": "processed", "status_details": None}


async def upload(request: web.Request) -> web.Response:
    principal = principal_of(request)
    request = request.clone(client_max_size=max(MAX_FILE_BYTES + (1 << 20),
                                                request.client_max_size))
    form = await request.post()
    if form.get("purpose") != "batch":
        raise ApiError(Kind.BAD_REQUEST, "purpose: only 'batch' files are kept here",
                       param="purpose")
    field = form.get("file")
    if field is None or not hasattr(field, "file"):
        raise ApiError(Kind.BAD_REQUEST, "file: a JSONL file is required", param="file")
    data = field.file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ApiError(Kind.TOO_LARGE, f"file: at most {MAX_FILE_BYTES >> 20} MiB")
    meta = {"id": "file-" + secrets.token_hex(12), "bytes": len(data),
            "created_at": time.time(), "filename": field.filename or "batch.jsonl",
            "purpose": "batch"}
    folder = _files_folder(request, principal.tenant)
    write_private(folder / f"{meta['id']}.jsonl", data)
    write_private(folder / f"{meta['id']}.json", json.dumps(meta).encode())
    return web.json_response(file_body(meta))


def _file(request: web.Request, file_id: str) -> dict:
    folder = _files_folder(request, principal_of(request).tenant)
    path = folder / f"{file_id}.json"
    if "/" in file_id or not path.exists():
        raise ApiError(Kind.NOT_FOUND, f"No such File object: {file_id}", param="file_id")
    return json.loads(path.read_text())


async def retrieve_file(request: web.Request) -> web.Response:
    file_id = request.match_info["id"]
    batch = _result_file_batch(request, file_id)
    if batch is not None:
        return web.json_response(file_body({"id": file_id, "bytes": 0, "purpose": "batch_output",
                                            "created_at": batch.created_at,
                                            "filename": f"{file_id}.jsonl"}))
    return web.json_response(file_body(_file(request, file_id)))


async def file_content(request: web.Request) -> web.Response:
    file_id = request.match_info["id"]
    batch = _result_file_batch(request, file_id)
    if batch is not None:
        wanted = {"succeeded"} if file_id.startswith("file-out-") else {
            "errored", "canceled", "expired"}
        store = request.app[BATCHES]["store"]
        lines = [json.dumps({**r["body"], "custom_id": r["custom_id"]}, ensure_ascii=False)
                 for r in store.results(batch) if r["outcome"] in wanted]
        return web.Response(text="".join(line + "\n" for line in lines),
                            content_type="application/octet-stream")
    meta = _file(request, file_id)
    folder = _files_folder(request, principal_of(request).tenant)
    return web.Response(body=(folder / f"{meta['id']}.jsonl").read_bytes(),
                        content_type="application/octet-stream")


async def delete_file(request: web.Request) -> web.Response:
    file_id = request.match_info["id"]
    meta = _file(request, file_id)
    folder = _files_folder(request, principal_of(request).tenant)
    for suffix in (".jsonl", ".json"):
        (folder / f"{meta['id']}{suffix}").unlink(missing_ok=True)
    return web.json_response({"id": file_id, "object": "file", "deleted": True})


def _result_file_batch(request: web.Request, file_id: str) -> Batch | None:
    """The batch an output / error file id names (the caller's own, ended), or None."""
    for prefix in ("file-out-", "file-err-"):
        if file_id.startswith(prefix):
            store = request.app[BATCHES]["store"]
            batch = store.get(principal_of(request).tenant, file_id[len(prefix):])
            if batch is None or batch.api != "openai" or batch.status != "ended":
                raise ApiError(Kind.NOT_FOUND, f"No such File object: {file_id}")
            return batch
    return None


# -- batches -----------------------------------------------------------------------------
def parse_lines(data: bytes, endpoint: str) -> list[dict]:
    """The input file as batch lines; a line that cannot run is kept with ``invalid`` (its
    own error line later). Custom ids must be unique."""
    lines, seen = [], set()
    for i, raw in enumerate(data.decode("utf-8", "replace").splitlines()):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except ValueError:
            item = None
        custom_id = item.get("custom_id") if isinstance(item, dict) else None
        if not isinstance(custom_id, str) or not custom_id or custom_id in seen:
            custom_id = f"line-{i + 1}"
            problem = f"line {i + 1}: not a JSON object with a new custom_id"
        elif item.get("method", "POST") != "POST" or item.get("url") != endpoint:
            problem = f"line {i + 1}: method POST and url {endpoint} required"
        elif not isinstance(item.get("body"), dict):
            problem = f"line {i + 1}: body must be an object"
        else:
            problem = ""
        seen.add(custom_id)
        line = {"custom_id": custom_id, "params": item.get("body") if isinstance(item, dict)
                else None}
        if problem:
            line["invalid"] = problem
        lines.append(line)
    return lines


def batch_body(batch: Batch) -> dict:
    ended = batch.status == "ended"
    if not ended:
        status = STATUS[batch.status]
    elif batch.cancel_initiated_at is not None:
        status = "cancelled"
    else:
        status = "expired" if batch.counts["expired"] else "completed"
    failed = batch.counts["errored"] + batch.counts["canceled"] + batch.counts["expired"]
    extra = batch.extra
    return {"id": batch.id, "object": "batch", "endpoint": extra["endpoint"], "errors": None,
            "input_file_id": extra["input_file_id"], "completion_window": "24h",
            "status": status,
            "output_file_id": f"file-out-{batch.id}" if ended else None,
            "error_file_id": f"file-err-{batch.id}" if ended and failed else None,
            "created_at": int(batch.created_at), "in_progress_at": int(batch.created_at),
            "expires_at": int(batch.expires_at),
            "finalizing_at": None, "completed_at": int(batch.ended_at) if ended else None,
            "failed_at": None, "expired_at": None,
            "cancelling_at": int(batch.cancel_initiated_at) if batch.cancel_initiated_at else None,
            "cancelled_at": int(batch.ended_at) if ended and batch.cancel_initiated_at else None,
            "request_counts": {"total": batch.total, "completed": batch.counts["succeeded"],
                               "failed": failed},
            "metadata": extra.get("metadata")}


def _own(request: web.Request) -> Batch:
    batch = request.app[BATCHES]["store"].get(principal_of(request).tenant,
                                              request.match_info["id"])
    if batch is None or batch.api != "openai":
        raise ApiError(Kind.NOT_FOUND, f"No batch found with id '{request.match_info['id']}'")
    return batch


async def create(request: web.Request) -> web.Response:
    principal, state = principal_of(request), state_of(request)
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ApiError(Kind.BAD_REQUEST, "request body must be a JSON object")
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise ApiError(Kind.BAD_REQUEST, f"endpoint: one of {list(ENDPOINTS)}",
                       param="endpoint")
    if body.get("completion_window", "24h") != "24h":
        raise ApiError(Kind.BAD_REQUEST, "completion_window: 24h", param="completion_window")
    meta = _file(request, str(body.get("input_file_id", "")))
    folder = _files_folder(request, principal.tenant)
    lines = parse_lines((folder / f"{meta['id']}.jsonl").read_bytes(), endpoint)
    if not lines or len(lines) > MAX_REQUESTS:
        raise ApiError(Kind.BAD_REQUEST, f"input_file_id: 1 to {MAX_REQUESTS} requests",
                       param="input_file_id")
    store = request.app[BATCHES]["store"]
    check_quota(store, principal.tenant, len(lines))
    state.check_rate(principal)
    batch = store.create("openai", principal.tenant, lines, prefix="batch_", extra={
        "admin": principal.is_admin, "endpoint": endpoint, "input_file_id": meta["id"],
        "metadata": body.get("metadata")})
    request.app[BATCHES]["runner"].add(batch)
    return web.json_response(batch_body(batch))


async def retrieve(request: web.Request) -> web.Response:
    return web.json_response(batch_body(_own(request)))


async def list_batches(request: web.Request) -> web.Response:
    batches = request.app[BATCHES]["store"].list(principal_of(request).tenant, "openai")
    try:
        limit = min(100, max(1, int(request.query.get("limit", 20))))
    except ValueError:
        raise ApiError(Kind.BAD_REQUEST, "limit must be a number", param="limit") from None
    ids = [b.id for b in batches]
    after = request.query.get("after")
    start = ids.index(after) + 1 if after in ids else 0
    page = batches[start:start + limit]
    return web.json_response({"object": "list", "data": [batch_body(b) for b in page],
                              "first_id": page[0].id if page else None,
                              "last_id": page[-1].id if page else None,
                              "has_more": start + limit < len(batches)})


async def cancel(request: web.Request) -> web.Response:
    batch = _own(request)
    if batch.status == "in_progress":
        request.app[BATCHES]["runner"].cancel(batch)
    return web.json_response(batch_body(batch))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/files", upload)
    app.router.add_get("/v1/files/{id}", retrieve_file)
    app.router.add_get("/v1/files/{id}/content", file_content)
    app.router.add_delete("/v1/files/{id}", delete_file)
    app.router.add_post("/v1/batches", create)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{id}", retrieve)
    app.router.add_post("/v1/batches/{id}/cancel", cancel)
