"""Why a prompt missed the cache (``GET /v1/cache/diagnostics/{id}``, gateway/diagnostics.py):
the divergence point and its part for edited tool lists and moved breakpoints, each
breakpoint's fate (read, created: new / expired / evicted, or why not cached), text only for
requests that opt in, and never another tenant's requests, text or counts."""
from __future__ import annotations

import types as pytypes

import aiohttp

from radixgate.gateway.diagnostics import DiagnosticsBook, Part, Record, digest
from tests.support import client as c
from tests.support.inproc import in_process_gateway
from tests.support.server import ADMIN_KEY, tenant_key

OPT_IN = {"radixgate-cache-diagnostics": "1"}
SYSTEM = "You are the cache's own assistant. Keep answers short and exact. " * 6


def tool(name: str, description: str) -> dict:
    return {"name": name, "description": description,
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}


def ephemeral(text: str) -> dict:
    return {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}


async def send(http, base: str, tenant: str, body: dict, opt_in: bool = True) -> str:
    """POSTs an Anthropic request; returns its request id."""
    headers = {**c.headers(tenant_key(tenant)), **(OPT_IN if opt_in else {})}
    async with http.post(base + c.ANTHROPIC_PATH, headers=headers, json=body) as answer:
        assert answer.status == 200, await answer.text()
        return answer.headers["request-id"]


async def report(http, base: str, key: str, request_id: str) -> tuple[int, dict]:
    return await c.get_json(http, f"{base}/v1/cache/diagnostics/{request_id}", key)


def body(messages: list, tools: list | None = None, **extra) -> dict:
    out = {"model": c.MODEL, "max_tokens": 1, "temperature": 0, "messages": messages,
           "system": [ephemeral(SYSTEM)], **extra}
    if tools:
        out["tools"] = tools
    return out


async def test_an_edited_tool_list_is_named_with_its_first_differing_text():
    tools = [tool("search", "Search the index."), tool("fetch", "Fetch one page by id.")]
    edited = [tools[0], tool("fetch", "Fetch one page by URL.")]
    question = [{"role": "user", "content": "Find the paper."}]
    async with in_process_gateway(tenants=("acme",)) as (base, app):
        async with aiohttp.ClientSession() as http:
            await send(http, base, "acme", body(question, tools))
            second = await send(http, base, "acme", body(question, edited))
            status, got = await report(http, base, tenant_key("acme"), second)
    assert status == 200
    assert got["divergence"]["part"] == "tool 1" and not got["divergence"]["whole_prompt_read"]
    compared = got["compared_with"]
    assert compared["first_different_part"] == "tool 1"
    assert "by URL" in compared["this_text"] and "by id" in compared["earlier_text"]
    assert got["breakpoints"][0]["status"] == "created"          # the system block after it


async def test_moved_breakpoints_read_the_earlier_turn_and_create_the_new_one():
    """Claude Code's rolling breakpoints: each turn moves the breakpoint to its last
    message; the next turn reads everything up to the earlier one."""
    turn1 = [{"role": "user", "content": [ephemeral("First question about blocks.")]}]
    turn2 = [{"role": "user", "content": "First question about blocks."},
             {"role": "assistant", "content": "Blocks hold 16 tokens."},
             {"role": "user", "content": [ephemeral("And pages?")]}]
    async with in_process_gateway(tenants=("acme",)) as (base, app):
        async with aiohttp.ClientSession() as http:
            first = await send(http, base, "acme", body(turn1))
            second = await send(http, base, "acme", body(turn2))
            _, one = await report(http, base, tenant_key("acme"), first)
            _, two = await report(http, base, tenant_key("acme"), second)
    assert [b["status"] for b in one["breakpoints"]] == ["created", "created"]
    assert [b["before"] for b in one["breakpoints"]] == ["new", "new"]
    system_end, turn1_end = (b["token"] for b in one["breakpoints"])
    assert [b["status"] for b in two["breakpoints"]] == ["read", "created"]
    assert two["cached_tokens"] >= turn1_end - 1
    assert two["divergence"]["part"] in ("message 0 block 0", "message 1 block 0")
    assert two["compared_with"]["request_id"] == first
    assert two["breakpoints"][1]["part"] == "message 2 block 0"


async def test_a_flushed_pin_is_evicted_and_text_stays_with_opted_in_requests():
    question = [{"role": "user", "content": "What is a radix tree?"}]
    async with in_process_gateway(tenants=("acme",)) as (base, app):
        async with aiohttp.ClientSession() as http:
            await send(http, base, "acme", body(question))
            status, _ = await c.post_json(http, base + "/v1/cache/flush", ADMIN_KEY,
                                          {"tenant": "acme"})
            assert status == 200
            again = await send(http, base, "acme", body(question), opt_in=False)
            _, got = await report(http, base, tenant_key("acme"), again)
    assert got["breakpoints"][0]["status"] == "created"
    assert got["breakpoints"][0]["before"] == "evicted"          # pinned, not expired: flushed
    assert got["text_kept"] is False and got["divergence"]["token"] == 0
    assert "this_text" not in (got["compared_with"] or {})


async def test_another_tenant_sees_neither_the_report_nor_the_text():
    question = [{"role": "user", "content": "Shared words, separate tenants."}]
    async with in_process_gateway(tenants=("acme", "beta")) as (base, app):
        async with aiohttp.ClientSession() as http:
            mine = await send(http, base, "acme", body(question))
            theirs = await send(http, base, "beta", body(question))
            status, refused = await report(http, base, tenant_key("beta"), mine)
            assert status == 404 and "acme" not in str(refused)
            _, got = await report(http, base, tenant_key("beta"), theirs)
            admin_status, _ = await report(http, base, ADMIN_KEY, mine)
    assert got["compared_with"] is None                  # acme's identical prompt is not its
    assert got["cached_tokens"] == 0 and admin_status == 200


def fake_usage(read: int, outcomes, disk: int = 0):
    return pytypes.SimpleNamespace(cache_read_tokens=read, cache_read_disk_tokens=disk,
                                   pin_outcomes=tuple(outcomes))


def record(book, request_id: str, offset: int, ttl_s: float) -> Record:
    tokens = list(range(offset + 8))
    made = Record(request_id, "acme", "ns", book.clock(), len(tokens),
                  (Part("system block 0", 0, len(tokens), digest(tokens)),),
                  ((offset, ttl_s, digest(tokens[:offset])),), False)
    book.start(made)
    return made


def test_an_expired_pin_is_told_apart_from_an_evicted_one_and_disk_reads_are_marked():
    now = [1000.0]
    book = DiagnosticsBook(clock=lambda: now[0])
    book.finish(record(book, "req_a", 64, 300.0), fake_usage(0, [(64, "pinned")]))
    now[0] += 400.0                                            # the 5-minute pin ran out
    late = record(book, "req_b", 64, 300.0)
    book.finish(late, fake_usage(0, [(64, "pinned")]))
    assert book.report(late)["breakpoints"][0]["before"] == "expired"
    now[0] += 10.0
    early = record(book, "req_c", 64, 300.0)                   # pinned 10 s ago: evicted
    book.finish(early, fake_usage(0, [(64, "pin_quota")]))
    mark = book.report(early)["breakpoints"][0]
    assert (mark["status"], mark["reason"], mark["before"]) == ("not_cached", "pin_quota",
                                                               "evicted")
    loaded = record(book, "req_d", 64, 300.0)
    book.finish(loaded, fake_usage(71, [], disk=40))
    mark = book.report(loaded)["breakpoints"][0]
    assert mark["status"] == "read" and mark["from_disk"]
    assert book.get("beta", "req_d") is None and book.get("acme", "req_d") is loaded


async def test_recent_diagnostics_outlive_a_restart_in_the_state_folder(tmp_path):
    cache = {"disk": {"dir": str(tmp_path / "kv"), "gb": 0.05}}
    question = [{"role": "user", "content": "Kept across a restart?"}]
    async with in_process_gateway(tenants=("acme",), cache=cache) as (base, app):
        async with aiohttp.ClientSession() as http:
            first = await send(http, base, "acme", body(question))
    async with in_process_gateway(tenants=("acme", "beta"), cache=cache) as (base, app):
        async with aiohttp.ClientSession() as http:
            status, got = await report(http, base, tenant_key("acme"), first)
            other, _ = await report(http, base, tenant_key("beta"), first)
    assert status == 200 and got["breakpoints"][0]["status"] == "created" and other == 404
    saved = tmp_path / "radixgate-state" / "diagnostics" / "recent.json"
    assert oct(saved.stat().st_mode & 0o777) == "0o600"
