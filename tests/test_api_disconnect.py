"""A client that disconnects (streaming or not) aborts its request and its blocks are freed:
checked through the admin stats (nothing running, no block in use), the integrity endpoint
and the ``aborted`` outcome counter."""
from __future__ import annotations

import json
import re
import socket
import time

import httpx2 as httpx   # the HTTP client the anthropic/openai SDKs install
import pytest

from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

# Own tenants (and so its own server, shared by the tests/test_api_*.py modules): other
# suites' pins and flushes on the default spec's tenants cannot disturb these, nor these them.
# pins are shared out per tenant (ceiling / 5 entries): 8 MB of KV gives each ~1600 tokens
SPEC = ServerSpec(tenants=("gw_one", "gw_two", "org_1", "org_12345"), max_pinned_tokens=4096,
                  kv_cache_gb=0.008)
ADMIN = {"x-api-key": ADMIN_KEY}
TENANT = "gw_one"
KEY = {"x-api-key": tenant_key(TENANT)}
LONG = 400          # tokens: seconds of decoding on the tiny model, so the abort comes first
SETTLE_S = 120      # generous bound on waiting for an event on a loaded machine


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


def aborted_count(base_url: str) -> float:
    text = httpx.get(base_url + "/metrics", headers=ADMIN).text
    pattern = (r'radixgate_requests_total\{api="(?:anthropic|openai)",outcome="aborted",'
               rf'tenant="{TENANT}"\}} ([0-9.e+]+)')
    return sum(float(m) for m in re.findall(pattern, text))


def wait_until_idle(base_url: str, timeout_s: float = SETTLE_S) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = httpx.get(base_url + "/v1/cache/stats", headers=ADMIN).json()
        if stats["requests"]["running"] == 0 and stats["blocks"]["in_use"] == 0:
            return stats
        assert time.monotonic() < deadline, f"still busy: {stats['requests']} {stats['blocks']}"
        time.sleep(0.1)


def assert_freed(base_url: str, aborted_before: float) -> None:
    stats = wait_until_idle(base_url)
    assert stats["requests"]["waiting"] == 0
    report = httpx.get(base_url + "/v1/admin/integrity", headers=ADMIN).json()
    assert report["ok"] is True and report["running"] == 0 and report["locks"] == 0
    deadline = time.monotonic() + SETTLE_S
    while aborted_count(base_url) < aborted_before + 1:
        assert time.monotonic() < deadline, "the request was not aborted"
        time.sleep(0.1)


@pytest.mark.parametrize("path, body", [
    ("/v1/messages", {"model": "claude-3-x", "max_tokens": LONG, "stream": True,
                      "messages": [{"role": "user", "content": "tell a long story"}]}),
    ("/v1/chat/completions", {"model": "gpt-4o", "max_tokens": LONG, "stream": True,
                              "messages": [{"role": "user", "content": "tell a long story"}]}),
])
def test_streaming_client_disconnect_aborts_and_frees_blocks(server, path, body):
    before = aborted_count(server.base_url)
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        with client.stream("POST", path, json=body, headers=KEY) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            received = [next(lines) for _ in range(6)]
            assert any(line.startswith("data:") for line in received)
            stats = httpx.get(server.base_url + "/v1/cache/stats", headers=ADMIN).json()
            assert stats["requests"]["running"] >= 1 and stats["blocks"]["in_use"] >= 1
    assert_freed(server.base_url, before)


def wait_until_running(base_url: str, sock: socket.socket) -> None:
    """Until the stats show a running request; fails if its response came first."""
    deadline = time.monotonic() + SETTLE_S
    while httpx.get(base_url + "/v1/cache/stats", headers=ADMIN).json()["requests"]["running"] < 1:
        sock.settimeout(0.05)
        try:
            assert not sock.recv(1, socket.MSG_PEEK), "the request finished before the disconnect"
        except TimeoutError:
            pass
        assert time.monotonic() < deadline, "the request never started running"


def test_non_streaming_client_disconnect_aborts_and_frees_blocks(server):
    """Disconnect on an event (the request runs), not on a client timeout."""
    before = aborted_count(server.base_url)
    body = json.dumps({"model": "claude-3-x", "max_tokens": LONG,
                       "messages": [{"role": "user", "content": "write an essay"}]}).encode()
    head = (f"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"x-api-key: {KEY['x-api-key']}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head + body)
        wait_until_running(server.base_url, sock)
    assert_freed(server.base_url, before)
