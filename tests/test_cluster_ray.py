"""Scale-out on a local Ray cluster: ``radixgate serve --tiny --replicas 2`` behind the
prefix router, over real HTTP. Repeats of a prefix read what one cache would, tenants stay
isolated across replicas, the stats list the replicas, and a killed replica fails no new
request (Ray Serve starts a new one)."""
from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request

import psutil
import pytest

from tests.support.server import ADMIN_KEY, ServerProcess, ServerSpec, tenant_key
from tests.test_dashboard_browser import CHROMIUM, browser, open_with_key, page  # noqa: F401

pytest.importorskip("ray.serve")

# routed_ttl_s 0: the router believes only the replicas' KV events, never its routing notes
SPEC = ServerSpec(kv_cache_gb=0.004, extra_args=("--replicas", "2", "--threads", "1"),
                  tenants=("acme", "beta"), cluster_settings=(("routed_ttl_s", "0"),))
PREFIX_LEN = 96                         # 6 blocks of 16


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(SPEC).start(timeout_s=240)
    family = [srv.proc.pid] + [p.pid for p in psutil.Process(srv.proc.pid).children(recursive=True)]
    try:
        yield srv
    finally:
        srv.stop(timeout_s=60)
        end_leftovers(family)


def end_leftovers(pids: list[int]) -> None:
    """Ray's processes started by the server end with it; whatever is left (a crash) is
    ended here, by pid: only processes this test's server started."""
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.wait(timeout=5)
        except psutil.NoSuchProcess:
            continue
        except psutil.TimeoutExpired:
            proc.kill()


def call(srv, path: str, key: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(srv.base_url + path, data=data, headers={
        "content-type": "application/json", "authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if text.startswith("{") else text)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def complete(srv, tenant: str, tokens: list[int]) -> tuple[int, int]:
    """(status, cached prompt tokens) of a token-id completion."""
    status, body = call(srv, "/v1/completions", tenant_key(tenant), {
        "model": "gpt-4o-mini", "prompt": tokens, "max_tokens": 2, "temperature": 0})
    assert status == 200, body
    return status, body["usage"]["prompt_tokens_details"]["cached_tokens"]


def prompts(base: int, count: int) -> list[list[int]]:
    prefix = list(range(base, base + PREFIX_LEN))
    return [prefix + [base + PREFIX_LEN + 1 + i] for i in range(count)]


def test_repeats_of_a_prefix_read_what_one_cache_would(server):
    """Without routing notes (``routed_ttl_s = 0``) only the KV events of the replica that
    cached the prefix tell the router where it is: each repeat ends in a full block of its
    own, so its home (the rendezvous hash of that block) is a coin toss between the two
    replicas: without the events, 9 repeats would all find the prefix once in 512 runs."""
    prefix = list(range(1000, 1000 + PREFIX_LEN))
    group = [prefix + list(range(2000 + 20 * i, 2017 + 20 * i)) for i in range(10)]
    complete(server, "acme", group[0])
    deadline = time.monotonic() + 20                  # its BlockStored reaches the router
    while time.monotonic() < deadline and max(indexed_blocks(server)) < len(group[0]) // 16:
        time.sleep(0.1)
    cached = [complete(server, "acme", p)[1] for p in group[1:]]
    assert cached == [PREFIX_LEN] * 9, (cached, indexed_blocks(server))


def test_requests_naming_an_explicit_cache_go_to_the_replica_that_holds_it(server):
    """A Gemini explicit cache is a pinned prefix on one replica: its KV events lead every
    request naming it there (each reads the whole cache)."""
    system = " ".join(f"Clause {i}: blocks are shared by reference." for i in range(20))
    status, cache = call(server, "/v1beta/cachedContents", tenant_key("acme"), {
        "model": "models/gemini-2.5-flash", "ttl": "600s",
        "systemInstruction": {"parts": [{"text": system}]},
        "contents": [{"role": "user", "parts": [{"text": "The contract follows."}]}]})
    assert status == 200, cache
    size = cache["usageMetadata"]["totalTokenCount"]
    deadline = time.monotonic() + 20                  # its BlockStored reaches the router
    while time.monotonic() < deadline and max(indexed_blocks(server)) < size // 16:
        time.sleep(0.1)
    read = []
    for k in range(6):
        status, answer = call(server, "/v1beta/models/gemini-2.5-flash:generateContent",
                              tenant_key("acme"), {
                                  "cachedContent": cache["name"],
                                  "contents": [{"role": "user", "parts": [{"text": f"Q{k}?"}]}],
                                  "generationConfig": {"maxOutputTokens": 1, "temperature": 0}})
        assert status == 200, answer
        read.append(answer["usageMetadata"].get("cachedContentTokenCount", 0))
    assert min(read) >= size, (read, size)


def test_a_batch_group_goes_to_one_replica(server):
    """The requests of a Message Batch that share a system prompt carry one routing hint:
    one replica computes the document, and every other request of the group reads it."""
    system = " ".join(f"Section {i}: a group of batch requests shares this." for i in range(20))
    status, batch = call(server, "/v1/messages/batches", tenant_key("beta"), {"requests": [
        {"custom_id": f"q{i}", "params": {
            "model": "claude-test", "max_tokens": 1, "temperature": 0, "system": system,
            "messages": [{"role": "user", "content": f"Question {i}?"}]}} for i in range(8)]})
    assert status == 200, batch
    deadline = time.monotonic() + 120
    while batch["processing_status"] != "ended" and time.monotonic() < deadline:
        time.sleep(0.1)
        batch = call(server, f"/v1/messages/batches/{batch['id']}", tenant_key("beta"))[1]
    req = urllib.request.Request(f"{server.base_url}/v1/messages/batches/{batch['id']}/results",
                                 headers={"authorization": f"Bearer {tenant_key('beta')}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        text = r.read().decode()
    reads = sorted(json.loads(line)["result"]["message"]["usage"]["cache_read_input_tokens"]
                   for line in text.splitlines())
    assert len(reads) == 8 and min(reads[1:]) > 100, reads


def indexed_blocks(srv) -> list[int]:
    """Blocks of each replica in the router's prefix index."""
    return [r["indexed_blocks"] for r in call(srv, "/v1/cache/stats", ADMIN_KEY)[1]["replicas"]]


def test_tenants_stay_isolated_across_replicas(server):
    group = prompts(7000, 4)
    for p in group:
        complete(server, "acme", p)
    assert [complete(server, "beta", p)[1] for p in group[:1]] == [0]
    status, stats = call(server, "/v1/cache/stats", tenant_key("beta"))
    assert status == 200 and set(stats["tenants"]) == {"beta"}
    assert all(r["running"] == 0 and r["blocks"]["cached"] == 0 for r in stats["replicas"])


def test_stats_and_metrics_list_each_replica(server):
    status, stats = call(server, "/v1/cache/stats", ADMIN_KEY)
    assert status == 200
    replicas = stats["replicas"]
    assert len(replicas) == 2
    assert sum(r["blocks"]["total"] for r in replicas) == stats["blocks"]["total"] > 0
    for r in replicas:
        assert {"hit_rate", "running", "waiting", "blocks", "in_flight"} <= set(r)
    status, metrics = call(server, "/metrics", ADMIN_KEY)
    assert status == 200
    for r in replicas:
        assert f'radixgate_replica_kv_blocks{{replica="{r["replica"]}"' in metrics


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"chromium not installed at {CHROMIUM}")
def test_the_dashboard_shows_each_replica(server, page):
    open_with_key(page, server.base_url, ADMIN_KEY)
    page.wait_for_selector("#replicas tr[data-replica]", timeout=15000)
    shown = page.eval_on_selector_all(
        "#replicas tr[data-replica]",
        "rows => rows.map(r => [r.dataset.replica, Number(r.querySelector("
        "'[data-stat=\"replica.hit_rate\"]').dataset.value)])")
    stats = call(server, "/v1/cache/stats", ADMIN_KEY)[1]
    assert sorted(name for name, _ in shown) == sorted(r["replica"] for r in stats["replicas"])
    assert all(0.0 <= rate <= 1.0 for _, rate in shown)
    assert page.errors == []


def test_structured_output_is_compiled_on_the_replica(server):
    schema = {"type": "object", "additionalProperties": False, "required": ["unit"],
              "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}}
    status, body = call(server, "/v1/chat/completions", tenant_key("acme"), {
        "model": "gpt-4o-mini", "max_tokens": 40, "temperature": 0,
        "messages": [{"role": "user", "content": "weather?"}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "w", "schema": schema, "strict": True}}})
    assert status == 200, body
    assert json.loads(body["choices"][0]["message"]["content"])["unit"] in ("celsius", "fahrenheit")


def test_a_killed_replica_fails_no_new_request_and_is_replaced(server):
    victims = [p for p in psutil.Process(server.proc.pid).children(recursive=True)
               if "ServeReplica" in " ".join(_cmdline(p))]
    assert len(victims) == 2, [_cmdline(p) for p in victims]
    before = {r["replica"] for r in call(server, "/v1/cache/stats", ADMIN_KEY)[1]["replicas"]}
    victims[0].send_signal(signal.SIGKILL)
    for p in prompts(9000, 4) + prompts(11000, 4):
        complete(server, "acme", p)                   # asserts 200
    deadline = time.monotonic() + 180              # a replica starts in ~10 s; far more on a busy machine
    while time.monotonic() < deadline:
        replicas = {r["replica"] for r in call(server, "/v1/cache/stats", ADMIN_KEY)[1]["replicas"]}
        if len(replicas) == 2 and replicas != before:
            break
        time.sleep(1)
    assert len(replicas) == 2 and replicas != before, (before, replicas)
    complete(server, "acme", prompts(13000, 1)[0])


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []
