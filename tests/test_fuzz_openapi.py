"""Schemathesis against ``/openapi.json`` of ``radixgate serve --tiny``: every
operation, positive and negative examples, answers no 5xx (except the documented
overloaded status), every error body is in its route's envelope, and afterwards no block
is leaked or locked and the integrity check is clean.

CI: the explicit examples and 15 generated ones per operation (positive and negative);
``-m slow``: 150, plus schemathesis's coverage phase (every boundary case the schema
defines: ~700 cases for /v1/messages alone, most of this file's time before it moved).
"""
from __future__ import annotations

import json
import urllib.request

import aiohttp
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from radixgate.gateway.openapi import build_openapi
from tests.support import client as c
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

SPEC = ServerSpec()
ADMIN_PATHS = ("/v1/cache/flush", "/v1/cache/prefixes", "/v1/admin")
FUZZ_SETTINGS = dict(deadline=None, derandomize=True,
                     suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


# The document the server serves, built in process so collection needs no server (a test
# below checks the served /openapi.json is this same document). Calls go to the server.
schema = schemathesis.openapi.from_dict(build_openapi())
without_coverage_phase = schemathesis.openapi.from_dict(
    build_openapi(), config=SchemathesisConfig.from_dict({"phases": {"coverage": {"enabled": False}}}))


def key_for(path: str) -> str:
    return ADMIN_KEY if path.startswith(ADMIN_PATHS) else tenant_key("acme")


def check_response(case, response) -> None:
    status, text = response.status_code, response.text
    path = case.operation.path
    assert status < 500 or status == c.OVERLOADED_STATUS[c.api_of(path)], \
        f"{case.method} {path} -> {status}: {text[:300]}"
    content_type = response.headers.get("content-type") or [""]   # header -> list of values
    if status >= 400 and content_type[0].startswith("application/json"):
        problem = c.check_error_envelope(c.api_of(path), status, text)
        assert problem is None, f"{case.method} {path}: {problem}"


def call(server, case):
    headers = {"x-api-key": key_for(case.operation.path), "anthropic-version": "2023-06-01"}
    return case.call(base_url=server.base_url, headers=headers, timeout=60)


def test_served_openapi_document_is_the_fuzzed_one(server):
    with urllib.request.urlopen(server.base_url + "/openapi.json", timeout=30) as r:
        assert json.loads(r.read()) == build_openapi()


@without_coverage_phase.parametrize()
@settings(max_examples=15, **FUZZ_SETTINGS)
def test_every_operation_answers_without_server_error(server, case):
    check_response(case, call(server, case))


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=150, **FUZZ_SETTINGS)
def test_every_operation_answers_without_server_error_long(server, case):
    check_response(case, call(server, case))


async def test_fuzzing_leaves_no_block_in_use_and_integrity_clean(server):
    async with aiohttp.ClientSession() as http:
        stats = await c.wait_quiescent(http, server.base_url, ADMIN_KEY, timeout_s=120)
        assert c.block_accounting_violation(stats) is None
        assert await c.integrity_violation(http, server.base_url, ADMIN_KEY) is None
