"""GET /v1/cache/usage and its per-day ledger (radixgate/gateway/usage_history.py): counts per
day match the responses' usage, a tenant sees only its own rows, CSV matches JSON, the
ledger outlives a restart in the state folder (0700 / 0600), a damaged file starts empty,
the day and tenant bounds hold, and bad query strings are 400s in the API's format."""
from __future__ import annotations

import asyncio
import csv
import io
import json
import logging
import stat
import threading
import time

import aiohttp
import pytest

from radixgate.gateway.cache_usage import CSV_COLUMNS, to_csv
from radixgate.gateway.usage_book import UsageBook
from radixgate.gateway.usage_history import FIELDS, UsageLedger, format_day, parse_date
from radixgate.runtime.engine.api import Usage
from tests.support import client as c
from tests.support.inproc import in_process_gateway
from tests.support.server import ADMIN_KEY, tenant_key

DAY = 86400.0
START = parse_date("2026-12-03") * DAY + 3600.0          # 01:00 UTC that day
LEDGER = ("usage", "ledger.json")
SYSTEM = " ".join(f"rule{i} keeps every answer short" for i in range(24))


class Clock:
    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def usage(prompt: int, read: int, w5m: int = 0, w1h: int = 0, w24h: int = 0, out: int = 2
          ) -> Usage:
    creation = w5m + w1h + w24h
    return Usage(prompt_tokens=prompt, cache_read_tokens=read, cache_creation_tokens=creation,
                 cache_creation_5m_tokens=w5m, cache_creation_1h_tokens=w1h,
                 cache_creation_24h_tokens=w24h, uncached_tokens=prompt - read - creation,
                 output_tokens=out)


def counts(rows: list[dict]) -> dict[tuple[str, str], int]:
    return {(r["date"], r["tenant"]): r["requests"] for r in rows}


# ---------------------------------------------------------------- the ledger, no server

def test_a_day_row_sums_requests_errors_and_every_token_bucket():
    clock = Clock()
    book = UsageBook(ledger=UsageLedger(None, clock=clock))
    book.record("acme", usage(100, 40, w5m=10, w1h=20, w24h=25, out=3), ok=True)
    book.record("acme", usage(50, 50, out=1), ok=True)
    book.record("acme", usage(70, 0), ok=False)          # failed: an error, no tokens
    book.record_rejected("acme")                         # refused: an error too
    clock.now += DAY
    book.record("acme", usage(10, 0), ok=True)
    assert book.ledger.rows() == [
        {"date": "2026-12-03", "tenant": "acme", "requests": 4, "errors": 2, "prompt": 150,
         "cache_read": 90, "cache_creation": {"5m": 10, "1h": 20, "24h": 25}, "uncached": 5,
         "output": 4},
        {"date": "2026-12-04", "tenant": "acme", "requests": 1, "errors": 0, "prompt": 10,
         "cache_read": 0, "cache_creation": {"5m": 0, "1h": 0, "24h": 0}, "uncached": 10,
         "output": 2}]
    assert book.totals("acme").tokens()["cache_creation_24h"] == 25     # the book's totals too


def test_rows_are_scoped_to_a_tenant_and_a_date_range_and_sorted():
    clock = Clock()
    ledger = UsageLedger(None, clock=clock)
    for _ in range(3):
        for tenant in ("zeta", "acme", "beta"):
            ledger.record(tenant, usage(10, 0), ok=True)
        clock.now += DAY
    days = ["2026-12-03", "2026-12-04", "2026-12-05"]
    assert [(r["date"], r["tenant"]) for r in ledger.rows()] == [
        (d, t) for d in days for t in ("acme", "beta", "zeta")]
    assert {r["tenant"] for r in ledger.rows("beta")} == {"beta"}
    assert ledger.rows("nobody") == []
    middle = parse_date("2026-12-04")
    assert counts(ledger.rows("acme", middle, middle)) == {("2026-12-04", "acme"): 1}
    assert [r["date"] for r in ledger.rows("acme", first=middle)] == days[1:]
    assert [r["date"] for r in ledger.rows("acme", last=middle)] == days[:2]


def test_the_day_bound_keeps_a_window_that_ends_today():
    clock = Clock()
    ledger = UsageLedger(None, clock=clock, max_days=3)
    for _ in range(5):
        ledger.record("acme", usage(10, 0), ok=True)
        clock.now += DAY
    clock.now -= DAY                                     # still the fifth day
    assert [r["date"] for r in ledger.rows()] == ["2026-12-05", "2026-12-06", "2026-12-07"]
    clock.now += 2 * DAY                                 # two quiet days: one row is left
    assert [r["date"] for r in ledger.rows()] == ["2026-12-07"]
    clock.now += 30 * DAY
    assert ledger.rows() == [] and ledger.tenants() == 0


def test_the_tenant_bound_drops_the_oldest_days_first_then_stops_counting_new_tenants():
    clock = Clock()
    ledger = UsageLedger(None, clock=clock, max_tenants=2)
    ledger.record("acme", usage(10, 0), ok=True)
    ledger.record("beta", usage(10, 0), ok=True)
    clock.now += DAY
    ledger.record("acme", usage(10, 0), ok=True)
    ledger.record("gamma", usage(10, 0), ok=True)         # day one goes, and beta with it
    assert counts(ledger.rows()) == {("2026-12-04", "acme"): 1, ("2026-12-04", "gamma"): 1}
    ledger.record("delta", usage(10, 0), ok=True)         # only today left: not counted
    ledger.record("acme", usage(10, 0), ok=True)          # known tenants still are
    assert counts(ledger.rows()) == {("2026-12-04", "acme"): 2, ("2026-12-04", "gamma"): 1}
    assert ledger.dropped == 1 and ledger.tenants() == 2


def test_csv_has_the_header_row_and_the_json_rows_flattened():
    clock = Clock()
    ledger = UsageLedger(None, clock=clock)
    ledger.record("acme", usage(100, 40, w5m=10, w1h=20, w24h=25, out=3), ok=True)
    ledger.record("o'brien, \"inc\"", usage(5, 0), ok=False)
    rows = ledger.rows()
    parsed = list(csv.reader(io.StringIO(to_csv(rows))))
    assert parsed[0] == list(CSV_COLUMNS)
    assert parsed[1:] == [_flat(r) for r in rows]
    assert parsed[1] == ["2026-12-03", "acme", "1", "0", "100", "40", "10", "20", "25", "5", "3"]


def _flat(row: dict) -> list[str]:
    creation = row.pop("cache_creation")
    row.update({f"cache_creation_{k}": v for k, v in creation.items()})
    return [str(row[name]) for name in CSV_COLUMNS]


def test_the_ledger_file_is_written_off_the_recording_thread_and_read_back(tmp_path):
    import radixgate.gateway.usage_history as history
    writers: list[str] = []
    original = history.write_private

    def spy(path, data):
        writers.append(threading.current_thread().name)
        original(path, data)
    path = tmp_path / "ledger.json"
    clock = Clock()
    history.write_private = spy
    try:
        ledger = UsageLedger(path, clock=clock, flush_interval_s=0.05)
        for k in range(20):
            ledger.record("acme", usage(10 + k, 0), ok=True)
        _wait_for(lambda: path.exists() and not ledger._dirty and ledger._writer is None)
    finally:
        history.write_private = original
    assert writers and threading.current_thread().name not in writers
    assert len(writers) <= 3                            # not one write per request
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = UsageLedger(path, clock=clock)
    assert again.rows() == ledger.rows() and again.rows()[0]["requests"] == 20


def test_a_failed_write_is_logged_once_and_retried_until_it_works(tmp_path, caplog):
    path = tmp_path / "missing" / "ledger.json"
    with caplog.at_level(logging.WARNING, logger="radixgate.gateway"):
        ledger = UsageLedger(path, clock=Clock(), flush_interval_s=0.01)
        ledger.record("acme", usage(10, 0), ok=True)
        time.sleep(0.2)                                  # several tries
        assert not path.exists() and ledger._writer is not None
        assert caplog.text.count("could not write") == 1
        path.parent.mkdir()
        _wait_for(lambda: ledger._writer is None)
    assert UsageLedger(path, clock=Clock()).rows() == ledger.rows()


def test_a_loaded_ledger_drops_the_days_that_fell_out_of_the_window(tmp_path):
    path = tmp_path / "ledger.json"
    clock = Clock()
    ledger = UsageLedger(path, clock=clock, max_days=2)
    ledger.record("acme", usage(10, 0), ok=True)
    clock.now += DAY
    ledger.record("acme", usage(20, 0), ok=True)
    assert ledger.flush() and len(ledger.rows()) == 2
    both = ledger.rows()
    clock.now += DAY                                     # the first day is now out
    assert [r["prompt"] for r in UsageLedger(path, clock=clock, max_days=2).rows()] == [20]
    assert UsageLedger(path, clock=clock, max_days=5).rows() == both


@pytest.mark.parametrize("content", [
    b"\x00\xff not json", b"[]", b'{"version": 2, "fields": [], "days": {}}',
    b'{"version": 1, "fields": ["requests"], "days": {"2026-12-3": {"acme": [1]}}}',
    b'{"version": 1, "fields": ["requests"], "days": {"2026-12-03": {"acme": [-1]}}}',
    b'{"version": 1, "fields": ["requests"], "days": {"2026-12-03": {"acme": [true]}}}',
    b'{"version": 1, "fields": ["requests"], "days": {"2026-12-03": {"acme": [1, 2]}}}',
    b'{"version": 1, "fields": ["requests"], "days": {"2026-12-03": []}}',
    b"[" * 100000])
def test_a_damaged_ledger_file_is_set_aside_and_the_ledger_starts_empty(tmp_path, caplog,
                                                                        content):
    path = tmp_path / "ledger.json"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="radixgate.gateway"):
        ledger = UsageLedger(path, clock=Clock())
    assert ledger.rows() == [] and "damaged" in caplog.text
    assert (tmp_path / "ledger.json.damaged").read_bytes() == content
    ledger.record("acme", usage(10, 0), ok=True)
    assert ledger.flush() and UsageLedger(path, clock=Clock()).rows() == ledger.rows()


def test_a_file_from_a_ledger_with_other_fields_loads_by_name(tmp_path):
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps({"version": 1, "fields": ["output", "requests", "future"],
                                "days": {"2026-12-03": {"acme": [7, 2, 99]}}}))
    [row] = UsageLedger(path, clock=Clock()).rows()
    assert (row["requests"], row["output"], row["prompt"]) == (2, 7, 0)


def test_dates_are_strict():
    assert format_day(parse_date("2026-12-03")) == "2026-12-03"
    for bad in ("2026-12-3", "20261203", "2026-13-01", "2026-02-30", "２０２６-12-03", ""):
        with pytest.raises(ValueError):
            parse_date(bad)
    assert len(FIELDS) == len(CSV_COLUMNS) - 2


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


# ---------------------------------------------------------------- over HTTP

def gateway(state_dir, tenants=("acme", "beta"), rpm: dict | None = None):
    """The gateway in process over the shared tiny model, with ``state_dir`` (None: no state
    folder); ``rpm``: requests per minute by tenant (default unlimited). Yields (base, app)."""
    return in_process_gateway(tenants=tenants, rpm=rpm,
                              server={"state_dir": str(state_dir) if state_dir else ""})


async def ask(http, key: str, prompt: str, ttl: str | None = None) -> tuple[int, dict]:
    system = [{"type": "text", "text": SYSTEM,
               **({"cache_control": {"type": "ephemeral", "ttl": ttl}} if ttl else {})}]
    body = c.anthropic_body(prompt, system=system, max_tokens=2)
    async with http.post(c.ANTHROPIC_PATH, headers=c.headers(key), json=body) as r:
        return r.status, await r.json()


def expected_row(usages: list[dict], errors: int = 0) -> dict:
    """The ledger row that the Anthropic ``usage`` objects of the answered requests make."""
    total = lambda name: sum(u[name] for u in usages)       # noqa: E731
    creation = lambda name: sum(u["cache_creation"][name] for u in usages)    # noqa: E731
    prompt = (total("input_tokens") + total("cache_creation_input_tokens")
              + total("cache_read_input_tokens"))
    return {"requests": len(usages) + errors, "errors": errors, "prompt": prompt,
            "cache_read": total("cache_read_input_tokens"),
            "cache_creation": {"5m": creation("ephemeral_5m_input_tokens"),
                               "1h": creation("ephemeral_1h_input_tokens"),
                               "24h": total("cache_creation_input_tokens")
                               - creation("ephemeral_5m_input_tokens")
                               - creation("ephemeral_1h_input_tokens")},
            "uncached": total("input_tokens"), "output": total("output_tokens")}


async def usage_of(http, base: str, key: str, query: str = "") -> dict:
    status, body = await c.get_json(http, base + "/v1/cache/usage" + query, key)
    assert status == 200, body
    return body


async def test_counts_match_the_answers_and_a_tenant_sees_only_its_own_rows(tmp_path):
    async with gateway(None, rpm={"beta": 1}) as (base, app):
        async with aiohttp.ClientSession(base) as http:
            acme = []
            for prompt, ttl in (("first", "1h"), ("second", "1h"), ("third", None)):
                status, body = await ask(http, tenant_key("acme"), prompt, ttl)
                assert status == 200, body
                acme.append(body["usage"])
            status, body = await ask(http, tenant_key("beta"), "hello")
            assert status == 200, body
            assert (await ask(http, tenant_key("beta"), "again"))[0] == 429   # over its rate
            today = format_day(int(time.time() // DAY))

            mine = await usage_of(http, base, tenant_key("acme"))
            assert mine["tenant"] == "acme"
            assert [(r["date"], r["tenant"]) for r in mine["days"]] == [(today, "acme")]
            row = mine["days"][0]
            counted = {k: v for k, v in row.items() if k not in ("date", "tenant")}
            assert counted == expected_row(acme)
            assert row["cache_read"] > 0 and row["cache_creation"]["1h"] > 0   # both kinds seen
            theirs = await usage_of(http, base, tenant_key("beta"))
            assert [(r["tenant"], r["requests"], r["errors"]) for r in theirs["days"]] == [
                ("beta", 2, 1)]
            assert theirs["days"][0]["prompt"] == sum(body["usage"][k] for k in (
                "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))

            admin = await usage_of(http, base, ADMIN_KEY)
            assert admin["tenant"] is None
            assert [r["tenant"] for r in admin["days"]] == ["acme", "beta"]
            assert admin["days"] == mine["days"] + theirs["days"]
            for key in (tenant_key("acme"), tenant_key("beta")):     # never another's, by any query
                for query in ("", f"?from={today}&to={today}", "?format=csv"):
                    async with http.get(base + "/v1/cache/usage" + query,
                                        headers=c.headers(key)) as r:
                        text = await r.text()
                    other = "beta" if key == tenant_key("acme") else "acme"
                    assert r.status == 200 and other not in text, (query, text)


async def test_csv_matches_json_and_the_date_range_selects_days(tmp_path):
    async with gateway(None) as (base, app):
        async with aiohttp.ClientSession(base) as http:
            for key in (tenant_key("acme"), tenant_key("beta")):
                assert (await ask(http, key, "question", "1h"))[0] == 200
            today = format_day(int(time.time() // DAY))
            for key in (ADMIN_KEY, tenant_key("beta")):
                rows = (await usage_of(http, base, key))["days"]
                async with http.get(base + "/v1/cache/usage?format=csv",
                                    headers=c.headers(key)) as r:
                    assert r.status == 200 and r.content_type == "text/csv"
                    text = await r.text()
                assert text == to_csv(rows)
                parsed = list(csv.reader(io.StringIO(text)))
                assert parsed[0] == list(CSV_COLUMNS) and len(parsed) == len(rows) + 1
                assert parsed[1:] == [_flat(dict(row)) for row in rows]
            assert len((await usage_of(http, base, ADMIN_KEY, f"?from={today}"))["days"]) == 2
            assert (await usage_of(http, base, ADMIN_KEY, "?to=2000-01-01"))["days"] == []
            assert (await usage_of(http, base, ADMIN_KEY, "?from=2999-01-01&format=json")
                    )["days"] == []


BAD_QUERIES = (("?tenant=beta", "tenant"), ("?from=2026-12-3", "from"), ("?to=yesterday", "to"),
               ("?from=2026-12-05&to=2026-12-04", "from"), ("?format=xml", "format"),
               ("?from=2026-12-03&from=2026-12-04", "from"))


async def test_bad_query_strings_are_400_in_the_apis_error_format():
    async with gateway(None) as (base, app):
        async with aiohttp.ClientSession(base) as http:
            for query, param in BAD_QUERIES:
                status, body = await c.get_json(http, base + "/v1/cache/usage" + query,
                                                tenant_key("acme"))
                assert status == 400, (query, body)
                assert body["error"]["type"] == "invalid_request_error"
                assert body["error"]["param"] == param and body["error"]["message"], query
            status, _ = await c.get_json(http, base + "/v1/cache/usage", None)
            assert status == 401


async def test_the_ledger_outlives_a_restart_in_a_private_state_folder(tmp_path):
    state = tmp_path / "state"
    async with gateway(state) as (base, app):
        async with aiohttp.ClientSession(base) as http:
            for k in range(4):                      # several, within the writer's interval
                assert (await ask(http, tenant_key("acme"), f"question {k}"))[0] == 200
            assert (await ask(http, tenant_key("beta"), "hello"))[0] == 200
            before = await usage_of(http, base, ADMIN_KEY)
    assert [(r["tenant"], r["requests"]) for r in before["days"]] == [("acme", 4), ("beta", 1)]
    folders = [state, *[p for p in state.rglob("*") if p.is_dir()]]
    files = [p for p in state.rglob("*") if p.is_file()]
    assert state / LEDGER[0] in folders and state.joinpath(*LEDGER) in files
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in folders + files} == {
        **{str(p): "0o700" for p in folders}, **{str(p): "0o600" for p in files}}

    async with gateway(state) as (base, app):
        async with aiohttp.ClientSession(base) as http:
            assert await usage_of(http, base, ADMIN_KEY) == before
            assert (await ask(http, tenant_key("acme"), "after the restart"))[0] == 200
            mine = await usage_of(http, base, tenant_key("acme"))
            assert [r["requests"] for r in mine["days"]] == [5]


async def test_a_damaged_ledger_file_starts_the_gateway_empty(tmp_path, caplog):
    state = tmp_path / "state"
    (state / LEDGER[0]).mkdir(parents=True)
    state.joinpath(*LEDGER).write_bytes(b'{"version": 1, "days": ')
    with caplog.at_level(logging.WARNING, logger="radixgate.gateway"):
        async with gateway(state) as (base, app):
            async with aiohttp.ClientSession(base) as http:
                assert (await usage_of(http, base, ADMIN_KEY))["days"] == []
                assert (await ask(http, tenant_key("acme"), "question"))[0] == 200
                assert [r["requests"] for r in (await usage_of(http, base, ADMIN_KEY))["days"]
                        ] == [1]
    assert "damaged" in caplog.text
    assert [r["requests"] for r in UsageLedger(state.joinpath(*LEDGER)).rows()] == [1]
