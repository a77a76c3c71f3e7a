"""Admission hardening: a request that fits the KV cache is served even
when the tree holds part of its prompt, the fit check counts exactly what can be freed and
what the request needs (copy-on-write and boundary blocks included), and an exception between
match and allocation gives back the match's lock and blocks. Engine-level tests on the tiny
model, and the plain repro over real loopback HTTP."""
from __future__ import annotations

import httpx2 as httpx
import pytest

from radixgate.runtime.engine.api import ErrorKind, FinishReason
from tests.support.engine_compare import assert_clean, greedy
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

B = 16
HEAD = [7, 8, 9, 10, 11]       # a shared chat-template head: the second prompt's match


def prompt(seed: int, n: int, head=HEAD) -> list[int]:
    return list(head) + [3000 + (97 * seed + j) % 20000 for j in range(n - len(head))]


def test_second_different_prompt_of_cache_size_is_served(make_engine):
    """The second prompt matches only the head of the first prompt's single node: that match
    must not lock the whole node, or nothing is evictable and the request is refused."""
    engine = make_engine(num_blocks=24, block_size=B, max_model_len=1024)
    first = engine.generate(greedy(prompt(1, 350), max_tokens=4))
    assert first.reason is FinishReason.LENGTH
    second = engine.generate(greedy(prompt(2, 350), max_tokens=4))
    assert second.reason is FinishReason.LENGTH, second.error_message
    assert second.usage.cache_read_tokens == len(HEAD)
    assert_clean(engine)
    again = engine.generate(greedy(prompt(2, 350), max_tokens=4))
    assert again.reason is FinishReason.LENGTH and again.usage.cache_read_tokens == 349
    assert_clean(engine)


@pytest.mark.parametrize("length", [24 * B, 24 * B - 7])
def test_prompt_filling_the_whole_cache_is_served_after_another(make_engine, length):
    """Exactly the cache's size (or nearly): the match's copy-on-write block, the replaced
    boundary block and the head locked by the match all count in the fit."""
    engine = make_engine(num_blocks=24, block_size=B, max_model_len=1024)
    assert engine.generate(greedy(prompt(1, length - 1), max_tokens=1)).reason is FinishReason.LENGTH
    result = engine.generate(greedy(prompt(2, length - 1), max_tokens=1))
    assert result.reason is FinishReason.LENGTH, result.error_message
    assert_clean(engine)
    full = engine.generate(greedy(prompt(2, length - 1), max_tokens=1))
    assert full.reason is FinishReason.LENGTH, full.error_message
    assert_clean(engine)


def test_prompt_that_cannot_fit_beside_pins_is_still_refused(make_engine):
    engine = make_engine(num_blocks=24, block_size=B, max_model_len=1024)
    pinned = prompt(1, 200)
    assert engine.generate(greedy(pinned, max_tokens=1, namespace="ns")).reason \
        is FinishReason.LENGTH
    assert engine.pin("ns", pinned[:160], ttl_s=600).result(timeout=30) == 160
    # 10 blocks pinned, 14 left: 15 blocks fit the submit check (24) but never the cache
    result = engine.generate(greedy(prompt(2, 15 * B), max_tokens=1, namespace="ns"))
    assert result.reason is FinishReason.ERROR and result.error_kind is ErrorKind.TOO_LONG
    assert engine.generate(greedy(prompt(3, 13 * B), max_tokens=1, namespace="ns")).reason \
        is FinishReason.LENGTH
    counts = assert_clean(engine)
    assert counts["free"] + counts["held"] == 24


def test_failed_copy_on_write_leaks_no_lock_or_block_and_engine_keeps_serving(make_engine):
    engine = make_engine(num_blocks=64, block_size=B, max_model_len=1024)
    base = prompt(1, 100)
    assert engine.generate(greedy(base, max_tokens=2)).reason is FinishReason.LENGTH
    blocks = engine.core.blocks
    real, calls = blocks._copy_on_write, []

    def fails_once(shared, valid_slots):
        calls.append(shared)
        if len(calls) == 1:
            raise RuntimeError("copy failed")
        return real(shared, valid_slots)

    blocks._copy_on_write = fails_once
    try:
        branch = base[:40] + prompt(2, 30, head=())   # reuse ends inside block 2: a copy
        result = engine.generate(greedy(branch, max_tokens=3), timeout=120)
        assert len(calls) >= 1
        assert result.reason is FinishReason.LENGTH, result.error_message
        assert result.usage.cache_read_tokens == 40
        counts = assert_clean(engine)
        assert counts["free"] + counts["held"] == counts["total"]
        later = engine.generate(greedy(prompt(3, 50), max_tokens=3))
        assert later.reason is FinishReason.LENGTH
        assert_clean(engine)
    finally:
        blocks._copy_on_write = real


# ---- over HTTP: the plain repro, scaled down ---------------------------------------------

HTTP_SPEC = ServerSpec(kv_cache_gb=0.0006, max_model_len=2048, tenants=("adm_one",),
                       kv_dtype="float32")
HEADERS = {"x-api-key": tenant_key("adm_one")}
ADMIN = {"x-api-key": ADMIN_KEY}


@pytest.fixture(scope="module")
def admission_server(pytestconfig):
    return shared_server(pytestconfig, HTTP_SPEC)


def system_prompt(word: str, repeat: int) -> str:
    return " ".join(f"{word}{i % 10}" for i in range(repeat))


def count_tokens(base_url: str, system: str) -> int:
    body = {"model": "claude-3-x", "system": system,
            "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(base_url + "/v1/messages/count_tokens", json=body, headers=HEADERS)
    assert response.status_code == 200, response.text
    return response.json()["input_tokens"]


def sized_system_prompt(base_url: str, word: str, target_tokens: int) -> str:
    """A system prompt whose rendered request is just under ``target_tokens``."""
    per_word = count_tokens(base_url, system_prompt(word, 200)) / 200
    repeat = int(target_tokens / per_word)
    while count_tokens(base_url, system_prompt(word, repeat)) > target_tokens:
        repeat -= max(1, repeat // 50)
    return system_prompt(word, repeat)


def assert_integrity(base_url: str) -> None:
    report = httpx.get(base_url + "/v1/admin/integrity", headers=ADMIN, timeout=30).json()
    assert report["ok"] is True and report["locks"] == 0 and report["running"] == 0, report
    assert report["free"] + report["held"] == report["total"], report


def test_http_second_different_system_prompt_of_cache_size_is_served(admission_server):
    base_url = admission_server.base_url
    total = httpx.get(base_url + "/v1/cache/stats", headers=ADMIN).json()["blocks"]["total"]
    target = total * B - 2 * B          # the prompt alone nearly fills the cache
    for word in ("alpha", "bravo"):
        body = {"model": "claude-3-x", "max_tokens": 4,
                "system": sized_system_prompt(base_url, word, target),
                "messages": [{"role": "user", "content": "hi"}]}
        response = httpx.post(base_url + "/v1/messages", json=body, headers=HEADERS, timeout=120)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["input_tokens"] > 0
        assert_integrity(base_url)
