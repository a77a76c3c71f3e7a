"""Anthropic Message Batches through the official SDK over loopback: create, retrieve, list,
results (JSONL), cancel, delete; a bad request fails alone; a tenant sees only its own
batches; requests are grouped by prompt so shared documents are computed once (hit rate as
good as sending them sorted by document); a restart resumes an unfinished batch without
redoing finished requests."""
from __future__ import annotations

import asyncio
import random

import anthropic
import pytest

from tests.support.inproc import engine_of, in_process_gateway
from tests.support.server import tenant_key

DOCS = [" ".join(f"Document {d} clause {i}: blocks are shared by reference." for i in range(24))
        for d in range(4)]


def client(base_url: str, tenant: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, api_key=tenant_key(tenant), max_retries=0)


def params(doc: int, question: int, **extra) -> dict:
    return {"model": "claude-test", "max_tokens": 2, "temperature": 0.0,
            "system": DOCS[doc], "messages": [{"role": "user", "content": f"Question {question}?"}],
            **extra}


def requests(pairs) -> list[dict]:
    return [{"custom_id": f"d{d}-q{q}", "params": params(d, q)} for d, q in pairs]


async def ask(claude, doc: int, question: int):
    """The same request sent interactively (the SDK takes temperature in extra_body)."""
    sent = params(doc, question)
    return await claude.messages.create(**{k: v for k, v in sent.items() if k != "temperature"},
                                        extra_body={"temperature": 0.0})


async def finish(claude, batch_id: str, timeout_s: float = 120):
    for _ in range(int(timeout_s / 0.05)):
        batch = await claude.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        await asyncio.sleep(0.05)
    raise TimeoutError(batch_id)


async def results(claude, batch_id: str) -> dict:
    return {r.custom_id: r.result async for r in await claude.messages.batches.results(batch_id)}


async def test_the_sdk_flow_and_a_bad_request_failing_alone():
    async with in_process_gateway(tenants=("acme", "beta")) as (base_url, app):
        claude = client(base_url, "acme")
        bad = {"custom_id": "bad", "params": {"model": "claude-test", "messages": []}}
        made = await claude.messages.batches.create(requests=requests([(0, 1), (0, 2), (1, 1)])
                                                    + [bad])
        assert made.processing_status == "in_progress" and made.request_counts.processing == 4
        done = await finish(claude, made.id)
        counts = done.request_counts
        assert (counts.succeeded, counts.errored, counts.processing) == (3, 1, 0)
        assert done.results_url.endswith(f"/v1/messages/batches/{made.id}/results")
        snap = engine_of(app).request_snapshot().result(timeout=30)
        assert snap.tree.pinned_tokens == 0                 # the group's pin went with it
        got = await results(claude, made.id)
        assert got["bad"].type == "errored" and "messages" in got["bad"].error.error.message
        alone = await ask(claude, 0, 2)
        assert got["d0-q2"].type == "succeeded"
        assert got["d0-q2"].message.content[0].text == alone.content[0].text
        listed = [b.id async for b in claude.messages.batches.list(limit=10)]
        assert listed == [made.id]
        beta = client(base_url, "beta")
        assert [b.id async for b in beta.messages.batches.list()] == []
        with pytest.raises(anthropic.NotFoundError):
            await beta.messages.batches.retrieve(made.id)
        with pytest.raises(anthropic.NotFoundError):
            await beta.messages.batches.delete(made.id)
        deleted = await claude.messages.batches.delete(made.id)
        assert deleted.type == "message_batch_deleted"
        with pytest.raises(anthropic.NotFoundError):
            await claude.messages.batches.retrieve(made.id)


async def test_cancel_ends_what_has_not_started():
    async with in_process_gateway(tenants=("acme",)) as (base_url, app):
        claude = client(base_url, "acme")
        made = await claude.messages.batches.create(
            requests=requests((d, q) for d in range(4) for q in range(12)))
        canceled = await claude.messages.batches.cancel(made.id)
        assert canceled.processing_status in ("canceling", "ended")
        assert canceled.cancel_initiated_at is not None
        with pytest.raises(anthropic.BadRequestError):
            if canceled.processing_status == "canceling":
                await claude.messages.batches.delete(made.id)
            else:
                raise anthropic.BadRequestError("ended at once", response=None, body=None)
        done = await finish(claude, made.id)
        assert done.request_counts.canceled > 0
        got = await results(claude, made.id)
        assert len(got) == 48 and {r.type for r in got.values()} <= {"succeeded", "canceled"}


async def hit_rate(pairs, batch: bool) -> float:
    """Cached / prompt tokens of ``pairs`` (document, question) with a KV budget holding
    about two of the four documents: as one batch, or sent one by one in the given order."""
    async with in_process_gateway(tenants=("acme",), kv_cache_gb=0.0004,
                                  cache={"kv_dtype": "float32"}) as (base_url, app):
        claude = client(base_url, "acme")
        if batch:
            made = await claude.messages.batches.create(requests=requests(pairs))
            await finish(claude, made.id, timeout_s=300)
            usages = [r.message.usage for r in (await results(claude, made.id)).values()]
        else:
            usages = [(await ask(claude, d, q)).usage for d, q in pairs]
    read = sum(u.cache_read_input_tokens for u in usages)
    return read / sum(u.cache_read_input_tokens + u.input_tokens
                      + u.cache_creation_input_tokens for u in usages)


async def test_a_shuffled_batch_reads_as_much_as_the_same_requests_sorted_by_document():
    pairs = [(d, q) for d in range(4) for q in range(8)]
    shuffled = random.Random(7).sample(pairs, len(pairs))
    in_batch, in_order = await hit_rate(shuffled, True), await hit_rate(pairs, False)
    unsorted = await hit_rate(shuffled, False)
    assert in_batch >= 0.95 * in_order, (in_batch, in_order)
    assert unsorted < 0.8 * in_order, (unsorted, in_order)   # the order matters at this budget


async def test_a_restart_resumes_a_batch_without_redoing_finished_requests(tmp_path):
    cache = {"disk": {"dir": str(tmp_path / "kv"), "gb": 0.05}}
    pairs = [(d, q) for d in range(4) for q in range(10)]
    async with in_process_gateway(tenants=("acme",), cache=cache) as (base_url, app):
        claude = client(base_url, "acme")
        made = await claude.messages.batches.create(requests=requests(pairs))
        for _ in range(2000):
            batch = await claude.messages.batches.retrieve(made.id)
            if batch.request_counts.succeeded >= 3:
                break
            await asyncio.sleep(0.01)
        before = batch.request_counts.succeeded
        assert 0 < before < len(pairs)
    stored = tmp_path / "radixgate-state" / "batches"
    lines_before = sum(1 for _ in stored.rglob("results.jsonl") for _ in open(_))
    assert lines_before >= before
    async with in_process_gateway(tenants=("acme",), cache=cache) as (base_url, app):
        claude = client(base_url, "acme")
        done = await finish(claude, made.id)
        got = await results(claude, made.id)
    assert done.request_counts.succeeded == len(pairs) and len(got) == len(pairs)
    lines = [line for path in stored.rglob("results.jsonl") for line in open(path)]
    assert len(lines) == len(pairs)                    # nothing ran twice


async def test_the_openai_sdk_flow_with_a_bad_line_in_the_error_file(tmp_path):
    import json as json_module

    import openai
    lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "gpt-4o-mini", "max_tokens": 2, "temperature": 0.0,
                       "messages": [{"role": "system", "content": DOCS[i % 2]},
                                    {"role": "user", "content": f"Question {i}?"}]}}
             for i in range(4)]
    async with in_process_gateway(tenants=("acme", "beta")) as (base_url, app):
        gpt = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=tenant_key("acme"),
                                 max_retries=0)
        batch, output = await openai_batch(gpt, tmp_path / "input.jsonl", lines, "not json\n")
        made = batch
        assert batch.request_counts.total == 5 and batch.request_counts.completed == 4
        assert batch.request_counts.failed == 1
        assert sorted(o["custom_id"] for o in output) == ["q0", "q1", "q2", "q3"]
        assert all(o["response"]["status_code"] == 200 for o in output)
        errors = [json_module.loads(x) for x in
                  (await gpt.files.content(batch.error_file_id)).text.splitlines()]
        assert errors[0]["custom_id"] == "line-5"
        assert errors[0]["response"]["status_code"] == 400
        assert [b.id async for b in gpt.batches.list()] == [made.id]
        plain = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                  "body": {"model": "gpt-4o-mini", "prompt": DOCS[0] + f" Q{i}",
                           "max_tokens": 2, "temperature": 0.0}} for i in range(2)]
        second, texts = await openai_batch(gpt, tmp_path / "plain.jsonl", plain)
        assert second.request_counts.completed == 2
        assert all(t["response"]["body"]["object"] == "text_completion" for t in texts)
        turns = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
                  "body": {"model": "gpt-4o-mini", "instructions": DOCS[1],
                           "input": f"Question {i}?", "max_output_tokens": 2,
                           "temperature": 0.0}} for i in range(2)]
        third, answers = await openai_batch(gpt, tmp_path / "turns.jsonl", turns)
        assert third.request_counts.completed == 2
        assert all(a["response"]["body"]["object"] == "response" for a in answers)
        beta = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key=tenant_key("beta"),
                                  max_retries=0)
        with pytest.raises(openai.NotFoundError):
            await beta.batches.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await beta.files.content(batch.input_file_id)
        assert [b.id async for b in beta.batches.list()] == []


async def openai_batch(gpt, path, lines: list[dict], extra: str = ""):
    """Uploads ``lines`` (then the raw ``extra``), runs them as a batch over their endpoint;
    (batch, its output file's lines)."""
    import json as json_module
    path.write_text("".join(json_module.dumps(x) + "\n" for x in lines) + extra)
    uploaded = await gpt.files.create(file=path.open("rb"), purpose="batch")
    assert uploaded.bytes == path.stat().st_size
    assert (await gpt.files.content(uploaded.id)).text == path.read_text()
    batch = await gpt.batches.create(input_file_id=uploaded.id, endpoint=lines[0]["url"],
                                     completion_window="24h")
    for _ in range(2400):
        batch = await gpt.batches.retrieve(batch.id)
        if batch.status == "completed":
            break
        await asyncio.sleep(0.05)
    output = [json_module.loads(x) for x in
              (await gpt.files.content(batch.output_file_id)).text.splitlines()]
    return batch, output


async def test_a_groups_system_part_is_pinned_while_its_requests_run():
    """The first request of a group to finish pins the shared system part for the others;
    the last one out unpins it (so finished groups hold no memory)."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from radixgate.gateway.batches.execute import GroupPins
    calls = []

    def done(value):
        future = Future()
        future.set_result(value)
        return future
    engine = SimpleNamespace(pin=lambda ns, tokens, ttl, owner: calls.append(("pin", ns)) or done(1),
                             unpin=lambda ns, tokens: calls.append(("unpin", ns)) or done(True))
    state = SimpleNamespace(require_engine=lambda: engine)
    pins, key = GroupPins(), ("ns-acme", "batch:1")
    for _ in range(3):
        pins.enter(key)
    await pins.leave(state, key, [1, 2, 3], "acme", ok=True)
    await pins.leave(state, key, [1, 2, 3], "acme", ok=True)
    assert calls == [("pin", "ns-acme")]
    await pins.leave(state, key, [1, 2, 3], "acme", ok=True)
    assert calls == [("pin", "ns-acme"), ("unpin", "ns-acme")] and not pins.running


async def test_unfinished_requests_expire_with_the_window_and_limits_are_400s(tmp_path):
    from radixgate.gateway.batches.runner import BatchApi, BatchRunner
    from radixgate.gateway.batches.store import COMPLETION_WINDOW_S, BatchStore
    now = [1000.0]
    store = BatchStore(tmp_path, clock=lambda: now[0])
    api = BatchApi(execute=None, ended=lambda outcome, line: {"result": {"type": outcome}},
                   group_key=lambda line: "")
    runner = BatchRunner(store, {"anthropic": api}, ready=lambda: False)
    batch = store.create("anthropic", "acme", [{"custom_id": f"r{i}", "params": {}}
                                              for i in range(3)])
    runner.add(batch)
    now[0] += COMPLETION_WINDOW_S + 1
    runner._expire()
    assert batch.status == "ended" and batch.counts["expired"] == 3
    assert [r["body"]["result"]["type"] for r in store.results(batch)] == ["expired"] * 3
    reloaded = BatchStore(tmp_path, clock=lambda: now[0]).batches[batch.id]
    assert reloaded.counts["expired"] == 3 and reloaded.status == "ended"
    async with in_process_gateway(tenants=("acme",)) as (base_url, app):
        claude = client(base_url, "acme")
        for bad in ([], [{"custom_id": "x y", "params": {}}],
                    [{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}]):
            with pytest.raises(anthropic.BadRequestError):
                await claude.messages.batches.create(requests=bad)


async def test_kill_9_mid_batch_loses_no_finished_result(tmp_path):
    """A server killed with SIGKILL while a batch runs: a new one on the same state folder
    keeps every result it had stored, runs the rest, and no request runs twice."""
    from tests.support.server import ServerProcess, ServerSpec
    spec = ServerSpec(tenants=("acme",), extra_args=("--state-dir", str(tmp_path / "state")))
    pairs = [(d, q) for d in range(4) for q in range(15)]
    stored = tmp_path / "state" / "batches"
    (tmp_path / "one").mkdir()
    server = ServerProcess(spec, tmp_path / "one").start()
    try:
        claude = client(server.base_url, "acme")
        made = await claude.messages.batches.create(requests=requests(pairs))
        for _ in range(4000):
            lines = [x for p in stored.rglob("results.jsonl") for x in open(p)]
            if len(lines) >= 5:
                break
            await asyncio.sleep(0.005)
    finally:
        server.kill()
    kept = {x for p in stored.rglob("results.jsonl") for x in open(p)}
    assert 5 <= len(kept) < len(pairs)
    (tmp_path / "two").mkdir()
    restarted = ServerProcess(spec, tmp_path / "two").start()
    try:
        claude = client(restarted.base_url, "acme")
        done = await finish(claude, made.id)
        got = await results(claude, made.id)
    finally:
        restarted.stop()
    lines = [x for p in stored.rglob("results.jsonl") for x in open(p)]
    assert done.request_counts.succeeded == len(pairs) == len(got) == len(lines)
    assert kept <= set(lines)                          # the stored results, as they were


async def test_a_tenants_open_requests_are_bounded(monkeypatch):
    import radixgate.gateway.batches.store as store_module
    monkeypatch.setattr(store_module, "MAX_OPEN_REQUESTS_PER_TENANT", 5)
    async with in_process_gateway(tenants=("acme", "beta")) as (base_url, app):
        claude = client(base_url, "acme")
        await claude.messages.batches.create(requests=requests([(0, q) for q in range(4)]))
        with pytest.raises(anthropic.RateLimitError):
            await claude.messages.batches.create(requests=requests([(1, 0), (1, 1)]))
        other = await client(base_url, "beta").messages.batches.create(
            requests=requests([(1, 0), (1, 1)]))                  # another tenant's own room
        assert other.request_counts.processing == 2
