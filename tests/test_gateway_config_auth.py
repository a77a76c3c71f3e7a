"""Config loading (TOML + flag overrides), API-key auth, namespaces and rate limits."""
from __future__ import annotations

import pytest

from radixgate.gateway.auth import AuthError, KeyRing, RateLimiter, namespace_for
from radixgate.gateway.config import ConfigError, config_from_dict, load_config

DESIGN_TOML = """
[server]
host = "127.0.0.1"
port = 8080
max_queue = 256
request_timeout_s = 600
[model]
path = "default"
name = "smollm2-135m-instruct"
aliases = ["claude-*", "gpt-*"]
max_model_len = 8192
[cache]
kv_cache_gb = 4
block_size = 16
policy = "credit"
[admin]
api_keys = ["sk-admin-1"]
[tenants.acme]
api_keys = ["sk-acme-1", "sk-acme-2"]
max_running = 16
max_pinned_tokens = 200000
requests_per_minute = 600
use_public_prefixes = true
[tenants.beta]
api_keys = ["sk-beta-1"]
use_public_prefixes = false
"""


def test_design_toml_loads_and_flags_override_file(tmp_path):
    path = tmp_path / "radixgate.toml"
    path.write_text(DESIGN_TOML)
    cfg = load_config(path, {"port": 9001, "block_size": 32, "host": None, "tiny": True})
    assert cfg.server.port == 9001 and cfg.server.host == "127.0.0.1"
    assert cfg.cache.block_size == 32 and cfg.model.tiny and cfg.cache.kv_cache_gb == 4.0
    assert cfg.cache.policy == "credit"
    assert cfg.model.aliases == ("claude-*", "gpt-*")
    assert cfg.admin_keys == ("sk-admin-1",)
    acme = {t.name: t for t in cfg.tenants}["acme"]
    assert acme.api_keys == ("sk-acme-1", "sk-acme-2") and acme.requests_per_minute == 600
    assert {t.name: t for t in cfg.tenants}["beta"].use_public_prefixes is False


@pytest.mark.parametrize("raw, fragment", [
    ({"server": {"prot": 1}}, "unknown keys"),
    ({"cache": {"block_size": "16"}}, "expected int"),
    ({"tenants": {"a": {"api_keys": ["k"]}, "b": {"api_keys": ["k"]}}}, "also used"),
    ({"tenants": {"public": {"api_keys": ["k"]}}}, "reserved"),
    ({"cache": {"block_size": 0}}, "block_size"),
    ({"cache": {"kv_cache_gb": 0}}, "kv_cache_gb"),
    ({"cache": {"policy": "fifo"}}, "policy"),
    ({"cache": {"kv_dtype": "int4"}}, "kv_dtype"),
    ({"cache": {"credit": {"branch_ticks": -1}}}, "branch_ticks"),
    ({"cache": {"credit": {"probation_tick": 5}}}, r"unknown keys in \[cache.credit\]"),
    ({"cache": {"credit": 5}}, r"\[cache.credit\] must be a table"),
    ({"cache": {"lru": True}}, r"unknown keys in \[cache\]"),
    ({"admin": {"keys": ["k"]}}, r"unknown keys in \[admin\]"),
    ({"sever": {}}, "unknown config sections"),
    ({"model": {"kv_cache": 4}}, r"unknown keys in \[model\]"),
])
def test_invalid_config_values_are_rejected_with_a_reason(raw, fragment):
    with pytest.raises(ConfigError, match=fragment):
        config_from_dict(raw)


def test_no_keys_refuses_non_loopback_host_but_keys_allow_it():
    with pytest.raises(ConfigError, match="non-loopback"):
        config_from_dict({}, {"host": "0.0.0.0"}).check_host_allowed()
    config_from_dict({}, {"host": "127.0.0.1"}).check_host_allowed()
    config_from_dict({"admin": {"api_keys": ["k"]}}, {"host": "0.0.0.0"}).check_host_allowed()


def test_keys_resolve_to_tenants_via_either_header():
    ring = KeyRing(config_from_dict({"admin": {"api_keys": ["sk-admin"]},
                                     "tenants": {"acme": {"api_keys": ["sk-acme"]}}}))
    assert ring.authenticate({"x-api-key": "sk-acme"}).tenant == "acme"
    bearer = ring.authenticate({"authorization": "Bearer sk-acme"})
    assert bearer.tenant == "acme" and not bearer.is_admin
    assert ring.authenticate({"x-api-key": "sk-admin"}).is_admin
    for headers in ({}, {"x-api-key": "sk-acm"}, {"authorization": "Basic sk-acme"}):
        with pytest.raises(AuthError):
            ring.authenticate(headers)


def test_open_server_without_keys_is_single_admin_tenant():
    principal = KeyRing(config_from_dict({})).authenticate({})
    assert principal.tenant == "default" and principal.is_admin


def test_namespace_is_length_prefixed_so_concatenations_differ():
    assert namespace_for("org_1", "2345") != namespace_for("org_12345", "")
    assert namespace_for("org_12345", None) == namespace_for("org_12345", "")
    assert namespace_for("acme", "a") != namespace_for("acme", "b")
    assert namespace_for("acme") != namespace_for("beta")


def test_rate_limiter_blocks_over_rate_and_reopens_after_window():
    now = [100.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert limiter.try_acquire("acme", 2) is None
    now[0] += 10
    assert limiter.try_acquire("acme", 2) is None
    wait = limiter.try_acquire("acme", 2)
    assert wait is not None and 49 <= wait <= 51
    assert limiter.try_acquire("beta", 2) is None          # tenants are independent
    now[0] += 51
    assert limiter.try_acquire("acme", 2) is None
    assert limiter.try_acquire("acme", 0) is None           # 0 = unlimited
