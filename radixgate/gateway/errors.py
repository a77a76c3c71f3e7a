"""Errors in each API's own envelope and status (docs/USAGE.md, Endpoints and Limits).

Handlers raise ``ApiError(kind, message, param=...)``; the error middleware renders it in
the envelope of the route's API:

- Anthropic (/v1/messages*): ``{"type": "error", "error": {"type": ..., "message": ...}}``
- OpenAI (/v1/chat/completions, /v1/completions, /v1/models):
  ``{"error": {"message", "type", "param", "code"}}``
- Gemini (/v1beta/*): ``{"error": {"code": HTTP status, "message", "status": "NOT_FOUND"...}}``
- everything else (admin, health): the OpenAI shape.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from radixgate.runtime.engine.api import ErrorKind


class Api(str, enum.Enum):
    ANTHROPIC = "anthropic"
    OPENAI = "openai"
    GEMINI = "gemini"


class Kind(str, enum.Enum):
    BAD_REQUEST = "bad_request"
    AUTHENTICATION = "authentication"
    PERMISSION = "permission"
    NOT_FOUND = "not_found"
    TOO_LARGE = "too_large"
    METHOD = "method_not_allowed"
    RATE_LIMIT = "rate_limit"
    OVERLOADED = "overloaded"
    TIMEOUT = "timeout"
    BODY_TIMEOUT = "body_timeout"      # the client did not send its body in time: 408
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


@dataclass(frozen=True, slots=True)
class _Style:
    status: int
    type: str
    code: str | None = None


_ANTHROPIC = {
    Kind.BAD_REQUEST: _Style(400, "invalid_request_error"),
    Kind.AUTHENTICATION: _Style(401, "authentication_error"),
    Kind.PERMISSION: _Style(403, "permission_error"),
    Kind.NOT_FOUND: _Style(404, "not_found_error"),
    Kind.METHOD: _Style(405, "invalid_request_error"),
    Kind.TOO_LARGE: _Style(413, "request_too_large"),
    Kind.RATE_LIMIT: _Style(429, "rate_limit_error"),
    Kind.OVERLOADED: _Style(529, "overloaded_error"),
    Kind.TIMEOUT: _Style(504, "timeout_error"),
    Kind.BODY_TIMEOUT: _Style(408, "timeout_error"),
    Kind.UNAVAILABLE: _Style(503, "api_error"),
    Kind.INTERNAL: _Style(500, "api_error"),
}

_OPENAI = {
    Kind.BAD_REQUEST: _Style(400, "invalid_request_error"),
    Kind.AUTHENTICATION: _Style(401, "authentication_error", "invalid_api_key"),
    Kind.PERMISSION: _Style(403, "permission_error", "permission_denied"),
    Kind.NOT_FOUND: _Style(404, "invalid_request_error", "not_found"),
    Kind.METHOD: _Style(405, "invalid_request_error", "method_not_allowed"),
    Kind.TOO_LARGE: _Style(413, "invalid_request_error", "request_too_large"),
    Kind.RATE_LIMIT: _Style(429, "rate_limit_error", "rate_limit_exceeded"),
    Kind.OVERLOADED: _Style(503, "server_error", "overloaded"),
    Kind.TIMEOUT: _Style(504, "server_error", "timeout"),
    Kind.BODY_TIMEOUT: _Style(408, "invalid_request_error", "request_timeout"),
    Kind.UNAVAILABLE: _Style(503, "server_error", "unavailable"),
    Kind.INTERNAL: _Style(500, "server_error", "internal_error"),
}

_GEMINI = {       # Google's status names (google.rpc.Code)
    Kind.BAD_REQUEST: _Style(400, "INVALID_ARGUMENT"),
    Kind.AUTHENTICATION: _Style(401, "UNAUTHENTICATED"),
    Kind.PERMISSION: _Style(403, "PERMISSION_DENIED"),
    Kind.NOT_FOUND: _Style(404, "NOT_FOUND"),
    Kind.METHOD: _Style(405, "UNIMPLEMENTED"),
    Kind.TOO_LARGE: _Style(413, "INVALID_ARGUMENT"),
    Kind.RATE_LIMIT: _Style(429, "RESOURCE_EXHAUSTED"),
    Kind.OVERLOADED: _Style(503, "UNAVAILABLE"),
    Kind.TIMEOUT: _Style(504, "DEADLINE_EXCEEDED"),
    Kind.BODY_TIMEOUT: _Style(408, "DEADLINE_EXCEEDED"),
    Kind.UNAVAILABLE: _Style(503, "UNAVAILABLE"),
    Kind.INTERNAL: _Style(500, "INTERNAL"),
}

_ENGINE_KINDS = {
    ErrorKind.BAD_REQUEST: Kind.BAD_REQUEST,
    ErrorKind.TOO_LONG: Kind.BAD_REQUEST,
    ErrorKind.OVER_CAPACITY: Kind.RATE_LIMIT,
    ErrorKind.OVERLOADED: Kind.OVERLOADED,
    ErrorKind.TIMEOUT: Kind.TIMEOUT,
    ErrorKind.INTERNAL: Kind.INTERNAL,
}


class ApiError(Exception):
    """An error answered to the client; ``code`` overrides the OpenAI default code."""

    def __init__(self, kind: Kind, message: str, *, param: str | None = None,
                 code: str | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def status(self, api: Api) -> int:
        return _styles(api)[self.kind].status

    def body(self, api: Api, request_id: str | None = None) -> dict:
        style = _styles(api)[self.kind]
        if api is Api.ANTHROPIC:
            body = {"type": "error", "error": {"type": style.type, "message": self.message}}
            if request_id:
                body["request_id"] = request_id
            return body
        if api is Api.GEMINI:
            return {"error": {"code": style.status, "message": self.message,
                              "status": style.type}}
        return {"error": {"message": self.message, "type": style.type, "param": self.param,
                          "code": self.code or style.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"retry-after": str(int(max(1, round(self.retry_after_s))))}


def _styles(api: Api) -> dict[Kind, _Style]:
    return {Api.ANTHROPIC: _ANTHROPIC, Api.GEMINI: _GEMINI}.get(api, _OPENAI)


def from_engine(kind: ErrorKind | None, message: str, request_id: str = "") -> ApiError:
    """Map a Finished(reason=error) to the API error the client sees. An internal error
    gets a generic message naming the request id only: the engine's text (an exception's)
    stays in the server log."""
    mapped = _ENGINE_KINDS.get(kind, Kind.INTERNAL) if kind is not None else Kind.INTERNAL
    if mapped is Kind.INTERNAL:
        message = "internal error while generating" + (
            f" (request id {request_id})" if request_id else "")
    retry = 1.0 if mapped in (Kind.RATE_LIMIT, Kind.OVERLOADED) else None
    code = "context_length_exceeded" if kind is ErrorKind.TOO_LONG else None
    return ApiError(mapped, message or mapped.value, code=code, retry_after_s=retry)


def api_for_path(path: str) -> Api:
    if path.startswith("/v1beta/"):
        return Api.GEMINI
    return Api.ANTHROPIC if path.startswith("/v1/messages") else Api.OPENAI
