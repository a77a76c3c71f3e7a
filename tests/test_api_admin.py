"""Operations over HTTP against the real server: cache stats (shape, scoping), tenant
isolation, flush, publishing and pinning prefixes, integrity, metrics, health, OpenAPI."""
from __future__ import annotations

import uuid

import httpx2 as httpx   # the HTTP client the anthropic/openai SDKs install
import pytest

from radixgate.gateway.auth import namespace_for
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

# Own tenants (and so its own server, shared by the tests/test_api_*.py modules): other
# suites' pins and flushes on the default spec's tenants cannot disturb these, nor these them.
# pins are shared out per tenant (ceiling / 5 entries): 8 MB of KV gives each ~1600 tokens
SPEC = ServerSpec(tenants=("gw_one", "gw_two", "org_1", "org_12345"), max_pinned_tokens=4096,
                  kv_cache_gb=0.008)
ADMIN = {"x-api-key": ADMIN_KEY}
ONE = {"x-api-key": tenant_key("gw_one")}
TWO = {"x-api-key": tenant_key("gw_two")}


@pytest.fixture(scope="module")
def http(pytestconfig):
    server = shared_server(pytestconfig, SPEC)
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def unique_text(words: int = 40) -> str:
    nonce = uuid.uuid4().hex
    return f"Manual {nonce}: " + " ".join(f"page{i}-{nonce[i % 32]}" for i in range(words))


def ask(http, headers, system: str, question: str = "q", **extra) -> dict:
    body = {"model": "claude-3-x", "max_tokens": 2, "system": system,
            "messages": [{"role": "user", "content": question}], **extra}
    response = http.post("/v1/messages", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def test_stats_have_the_design_shape(http):
    ask(http, ONE, unique_text(10))
    stats = http.get("/v1/cache/stats", headers=ADMIN).json()
    assert set(stats) >= {"model", "block_size", "uptime_s", "blocks", "tree", "requests", "tokens",
                          "hit_rate", "ttft_ms", "evictions", "tenants", "top_prefixes", "history"}
    assert set(stats["blocks"]) == {"total", "free", "cached", "pinned", "in_use"}
    assert sum(stats["blocks"][k] for k in ("free", "cached", "pinned", "in_use")) == stats["blocks"]["total"]
    assert set(stats["tree"]) == {"nodes", "cached_tokens", "evictable_tokens", "pinned_tokens",
                                  "namespaces"}
    assert set(stats["requests"]) == {"running", "waiting", "finished", "errors", "preemptions"}
    assert set(stats["tokens"]) == {"prompt", "cache_read", "cache_creation", "cache_creation_5m",
                                    "cache_creation_1h", "cache_creation_24h", "uncached",
                                    "output"}
    t = stats["tokens"]
    assert t["cache_read"] + t["cache_creation"] + t["uncached"] == t["prompt"]
    assert t["cache_creation_5m"] + t["cache_creation_1h"] + t["cache_creation_24h"] == \
        t["cache_creation"]
    assert stats["hit_rate"] == pytest.approx(t["cache_read"] / t["prompt"], abs=1e-5)
    assert set(stats["ttft_ms"]) == {"hit", "miss"} and set(stats["ttft_ms"]["hit"]) == {"p50", "p95"}
    assert set(stats["evictions"]) == {"lru", "ttl", "flush"}
    assert "gw_one" in stats["tenants"]
    assert set(stats["tenants"]["gw_one"]) >= {"tokens", "hit_rate", "pinned_tokens", "running"}
    assert all(set(p) >= {"tenant", "tokens", "hits", "pin_ttl_s", "preview"}
               for p in stats["top_prefixes"])
    assert stats["history"] and set(stats["history"][-1]) == {"t", "prompt", "cache_read"}


def test_tenant_sees_only_its_own_stats_without_previews(http):
    ask(http, ONE, unique_text(10))
    ask(http, TWO, unique_text(10))
    stats = http.get("/v1/cache/stats", headers=TWO).json()
    assert stats["tenant"] == "gw_two" and list(stats["tenants"]) == ["gw_two"]
    assert all(p["tenant"] == "gw_two" and "preview" not in p for p in stats["top_prefixes"])
    assert "gw_one" not in http.get("/v1/cache/stats", headers=TWO).text
    admin = http.get("/v1/cache/stats", headers=ADMIN).json()
    assert stats["tokens"] == admin["tenants"]["gw_two"]["tokens"]


def test_same_tenant_hits_and_another_tenant_gets_zero_cached_tokens(http):
    system = unique_text()
    first = ask(http, ONE, system)
    same = ask(http, ONE, system)
    other = ask(http, TWO, system)
    assert first["cache_read_input_tokens"] < 20
    assert same["cache_read_input_tokens"] > 40
    assert other["cache_read_input_tokens"] < 20          # only the template's first tokens
    shared_template = len("<|im_start|>system\n")         # bound well above its token count
    assert other["cache_read_input_tokens"] <= shared_template


def test_length_prefixed_namespaces_do_not_collide(http):
    system = unique_text()
    body = lambda salt: {"model": "gpt-4o", "max_tokens": 2, "cache_salt": salt,
                         "messages": [{"role": "system", "content": system},
                                      {"role": "user", "content": "x"}]}
    org_1 = {"x-api-key": tenant_key("org_1")}
    org_12345 = {"x-api-key": tenant_key("org_12345")}
    http.post("/v1/chat/completions", json=body("2345"), headers=org_1)
    hit = http.post("/v1/chat/completions", json=body("2345"), headers=org_1).json()
    miss = http.post("/v1/chat/completions", json=body(""), headers=org_12345).json()
    assert hit["usage"]["prompt_tokens_details"]["cached_tokens"] > 40
    assert miss["usage"]["prompt_tokens_details"]["cached_tokens"] < 20
    assert namespace_for("org_1", "2345") != namespace_for("org_12345", "")


def test_flush_of_one_tenant_drops_only_its_cache(http):
    system = unique_text()
    ask(http, ONE, system)
    ask(http, TWO, system)
    response = http.post("/v1/cache/flush", json={"tenant": "gw_one"}, headers=ADMIN)
    assert response.status_code == 200 and response.json()["freed_blocks"] > 0
    assert ask(http, ONE, system)["cache_read_input_tokens"] < 20
    assert ask(http, TWO, system)["cache_read_input_tokens"] > 40


def test_published_system_prompt_is_read_by_tenants_and_can_be_unpinned(http):
    system = unique_text()
    response = http.post("/v1/cache/prefixes", json={"system": system, "ttl": "1h"}, headers=ADMIN)
    assert response.status_code == 200, response.text
    published = response.json()
    assert published["namespace"] == "public" and published["pinned_tokens"] == published["tokens"]
    usage = ask(http, TWO, system)
    assert usage["cache_read_input_tokens"] >= published["tokens"]
    listed = http.get("/v1/cache/prefixes", headers=ADMIN).json()["data"]
    assert any(p["namespace"] == "public" and p["tokens"] == published["tokens"] for p in listed)
    removed = http.request("DELETE", "/v1/cache/prefixes", json={"system": system}, headers=ADMIN)
    assert removed.json()["unpinned"] is True
    listed = http.get("/v1/cache/prefixes", headers=ADMIN).json()["data"]
    assert not any(p["namespace"] == "public" and p["tokens"] == published["tokens"] for p in listed)
    flushed = http.post("/v1/cache/flush", json={"public": True}, headers=ADMIN).json()
    # the tenant's continuation still references every full public block; the public
    # prefix's last block is its own only when the prefix ends inside a block (the tenant
    # copied it before writing), so that is what a flush of public must free
    block_size = http.get("/v1/cache/stats", headers=ADMIN).json()["block_size"]
    ends_inside_a_block = published["tokens"] % block_size != 0
    assert flushed["namespace"] == "public" and flushed["freed_blocks"] >= int(ends_inside_a_block)
    assert ask(http, ONE, system)["cache_read_input_tokens"] < 20     # public is empty again


def test_admin_pins_a_prefix_for_one_tenant(http):
    text = unique_text(20)
    response = http.post("/v1/cache/prefixes", json={"text": text, "tenant": "gw_one",
                                                     "ttl_s": 120}, headers=ADMIN)
    assert response.status_code == 200, response.text
    pinned = response.json()
    assert pinned["pinned_tokens"] == pinned["tokens"] > 20
    stats = http.get("/v1/cache/stats", headers=ONE).json()
    assert stats["tree"]["pinned_tokens"] >= pinned["tokens"]
    completion = http.post("/v1/completions", json={"model": "gpt-4o", "prompt": text + " more",
                                                    "max_tokens": 1}, headers=ONE).json()
    assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] >= pinned["tokens"] - 1


def test_prefix_routes_validate_their_input(http):
    assert http.post("/v1/cache/prefixes", json={"ttl": "5m"}, headers=ADMIN).status_code == 400
    assert http.post("/v1/cache/prefixes", json={"text": "a", "tokens": [1]},
                     headers=ADMIN).status_code == 400
    assert http.post("/v1/cache/prefixes", json={"tokens": [10 ** 9]}, headers=ADMIN).status_code == 400
    assert http.post("/v1/cache/prefixes", json={"text": "a"}, headers=ONE).status_code == 403


def test_integrity_check_passes_after_traffic(http):
    ask(http, ONE, unique_text(10))
    report = http.get("/v1/admin/integrity", headers=ADMIN).json()
    assert report["ok"] is True and report["free"] + report["held"] == report["total"]


def test_metrics_are_prometheus_text_scoped_per_tenant(http):
    ask(http, ONE, unique_text(10))
    ask(http, TWO, unique_text(10))
    text = http.get("/metrics", headers=ADMIN).text
    for name in ("radixgate_prefix_cache_queries_total", "radixgate_prefix_cache_hit_tokens_total",
                 "radixgate_time_to_first_token_seconds_bucket",
                 "radixgate_inter_token_latency_seconds_bucket", "radixgate_kv_blocks{",
                 "radixgate_requests_running", "radixgate_requests_waiting",
                 "radixgate_cache_evictions_total", "radixgate_preemptions_total",
                 "vllm:num_requests_waiting",
                 "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert name in text, name
    assert 'tenant="gw_one"' in text and 'tenant="gw_two"' in text
    scoped = http.get("/metrics", headers=ONE).text
    assert 'tenant="gw_one"' in scoped and "gw_two" not in scoped
    assert "radixgate_kv_blocks{" not in scoped
    assert http.get("/metrics").status_code == 401


def test_health_and_openapi_document_every_endpoint(http):
    assert http.get("/health").json() == {"status": "ok", "model": "smollm2-135m-instruct",
                                          "deterministic": True}
    doc = http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions",
                 "/v1/completions", "/v1/models", "/health", "/metrics", "/v1/cache/stats",
                 "/v1/cache/flush", "/v1/cache/prefixes", "/v1/admin/integrity"):
        assert path in doc["paths"], path
    assert set(doc["paths"]["/v1/cache/prefixes"]) == {"get", "post", "delete"}
    schema = doc["paths"]["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]
    assert schema["schema"]["$ref"].endswith("/MessagesRequest")
    assert "max_tokens" in doc["components"]["schemas"]["MessagesRequest"]["properties"]
