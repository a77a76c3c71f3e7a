"""GET /v1/cache/usage: per-tenant cache accounting per UTC day, scoped to the caller.

An admin sees every tenant's rows, a tenant only its own (``tenant`` in the answer: the
scope, null for admin). Each row: ``date``, ``tenant``, ``requests``, ``errors``, ``prompt``,
``cache_read``, ``cache_creation`` (``5m``, ``1h``, ``24h``), ``uncached``, ``output``;
sorted by date then tenant. Query: ``from`` / ``to`` (YYYY-MM-DD, inclusive) and
``format`` (``json``, the default, or ``csv``: one header row, then a row per day and
tenant, ``cache_creation`` split into three columns). Any other parameter, a repeated one,
a bad date or ``from`` after ``to`` is a 400. The rows come from the usage book's ledger
(radixgate/gateway/usage_history.py): bounded, and kept across a restart in the state folder.
"""
from __future__ import annotations

import csv
import io

from aiohttp import web

from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.http_util import principal_of, state_of
from radixgate.gateway.usage_history import parse_date

PARAMS = ("from", "to", "format")
FORMATS = ("json", "csv")
CSV_COLUMNS = ("date", "tenant", "requests", "errors", "prompt", "cache_read",
               "cache_creation_5m", "cache_creation_1h", "cache_creation_24h", "uncached",
               "output")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/cache/usage", cache_usage)


async def cache_usage(request: web.Request) -> web.Response:
    state, principal = state_of(request), principal_of(request)
    first, last, form = _query(request)
    scope = None if principal.is_admin else principal.tenant
    rows = state.book.ledger.rows(scope, first, last)
    if form == "csv":
        return web.Response(text=to_csv(rows), content_type="text/csv", charset="utf-8")
    return web.json_response({"tenant": scope, "days": rows})


def _query(request: web.Request) -> tuple[int | None, int | None, str]:
    """(first day, last day, format) from the query string; ApiError(BAD_REQUEST) for an
    unknown or repeated parameter, a bad date, ``from`` after ``to`` or an unknown format."""
    query = request.query
    unknown = sorted(set(query) - set(PARAMS))
    if unknown:
        raise ApiError(Kind.BAD_REQUEST, f"unknown query parameters {unknown}; this endpoint "
                       f"takes {list(PARAMS)}", param=unknown[0])
    for name in PARAMS:
        if len(query.getall(name, [])) > 1:
            raise ApiError(Kind.BAD_REQUEST, f"query parameter {name} is given more than once",
                           param=name)
    first, last = _day(query, "from"), _day(query, "to")
    if first is not None and last is not None and first > last:
        raise ApiError(Kind.BAD_REQUEST, "from is after to", param="from")
    form = query.get("format", "json")
    if form not in FORMATS:
        raise ApiError(Kind.BAD_REQUEST, f"format: {form!r} is not one of {list(FORMATS)}",
                       param="format")
    return first, last, form


def _day(query, name: str) -> int | None:
    if name not in query:
        return None
    try:
        return parse_date(query[name])
    except ValueError:
        raise ApiError(Kind.BAD_REQUEST, f"{name}: {query[name]!r:.40} is not a date "
                       "(YYYY-MM-DD)", param=name) from None


def to_csv(rows: list[dict]) -> str:
    """The rows of GET /v1/cache/usage as CSV (``CSV_COLUMNS``, a header row first)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(CSV_COLUMNS)
    for row in rows:
        creation = row["cache_creation"]
        writer.writerow([row["date"], row["tenant"], row["requests"], row["errors"],
                         row["prompt"], row["cache_read"], creation["5m"], creation["1h"],
                         creation["24h"], row["uncached"], row["output"]])
    return out.getvalue()
