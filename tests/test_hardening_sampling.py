"""One tenant's sampling edge values or a failure in its own request must not break the
requests it shares a batch with.

- over real loopback: a victim streams while an attacker asks for ``temperature: 1e-39``
  (Anthropic) or ``1e-320`` (OpenAI chat and completions); every request answers 200 and
  the victim's stream ends normally;
- in process: an exception raised while emitting one request's token fails that request
  alone, with a generic message (the exception text stays in the log, with the request id).
"""
from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest

import radixgate.runtime.engine.core as core_module
from tests.support import client as c
from tests.support.inproc import in_process_gateway
from tests.support.server import ServerSpec, shared_server, tenant_key

VICTIM, ATTACKER = tenant_key("acme"), tenant_key("beta")
COMPLETIONS_PATH = "/v1/completions"
VICTIM_TOKENS = 200
SECRET = "secret-detail-7f3a"


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, ServerSpec())


def attacker_body(path: str, temperature: float, stream: bool) -> dict:
    if path == COMPLETIONS_PATH:
        body = {"model": c.OPENAI_MODEL, "prompt": "edge temperature", "max_tokens": 8,
                "temperature": temperature, "stream": stream}
    elif path == c.CHAT_PATH:
        body = c.chat_body("edge temperature", max_tokens=8, stream=stream)
    else:
        body = c.anthropic_body("edge temperature", max_tokens=8, stream=stream)
    return {**body, "temperature": temperature}


def attacker_problem(path: str, stream: bool, status: int, text: str) -> str | None:
    if status != 200:
        return f"attacker got {status}: {text[:300]}"
    if stream:
        return "attacker stream ended in error" if c.stream_ended_in_error(text) else None
    if path == COMPLETIONS_PATH:
        choice = json.loads(text)["choices"][0]
        return None if choice["finish_reason"] in ("stop", "length") else f"bad {choice}"
    return c.check_answer(path, False, status, text, 8)


async def victim_with_attack(http, base_url: str, path: str, temperature: float,
                             stream: bool) -> tuple[str, list[str | None]]:
    """Starts the victim's stream, sends two attacker requests while it decodes, then
    reads the victim to its end. Returns (victim text, attacker problems)."""
    body = c.anthropic_body("victim keeps going", max_tokens=VICTIM_TOKENS, stream=True)
    async with http.post(base_url + c.ANTHROPIC_PATH, headers=c.headers(VICTIM),
                         json=body) as victim:
        assert victim.status == 200
        head = await victim.content.readuntil(b"content_block_delta")   # decoding now

        async def attack():
            async with http.post(base_url + path, headers=c.headers(ATTACKER),
                                 json=attacker_body(path, temperature, stream)) as r:
                return attacker_problem(path, stream, r.status, await r.text())

        problems = await asyncio.gather(attack(), attack())
        rest = await victim.text()
    return head.decode() + rest, list(problems)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path, temperature", [(c.ANTHROPIC_PATH, 1e-39),
                                               (c.CHAT_PATH, 1e-320),
                                               (COMPLETIONS_PATH, 1e-320),
                                               (c.CHAT_PATH, 5e-324)])
async def test_tiny_temperature_answers_200_and_co_batched_victim_completes(
        http, server, path, temperature, stream):
    victim_text, problems = await victim_with_attack(http, server.base_url, path, temperature,
                                                     stream)
    assert problems == [None, None]
    assert not c.stream_ended_in_error(victim_text), victim_text[-400:]
    assert c.check_anthropic_stream(victim_text, VICTIM_TOKENS) is None


# ------------------------------------------------------------------ in process

@pytest.fixture
async def app_client():
    async with in_process_gateway(tenants=("acme", "beta")) as (base_url, app):
        async with aiohttp.ClientSession(base_url) as client:
            yield client


async def test_failure_in_one_requests_emit_fails_it_alone_with_a_generic_message(
        app_client, monkeypatch, caplog):
    real_append = core_module.append_token

    def append_or_fail(seq, token, *args):
        if seq.tenant == "beta":
            raise RuntimeError(f"{SECRET} while detokenizing")
        return real_append(seq, token, *args)

    monkeypatch.setattr(core_module, "append_token", append_or_fail)
    caplog.set_level(logging.ERROR, logger="radixgate.runtime.engine.core")
    victim_body = c.anthropic_body("victim", max_tokens=VICTIM_TOKENS, stream=True)
    async with app_client.post(c.ANTHROPIC_PATH, headers=c.headers(VICTIM),
                               json=victim_body) as victim:
        head = await victim.content.readuntil(b"content_block_delta")
        answers = []
        for path, build in ((c.ANTHROPIC_PATH, c.anthropic_body), (c.CHAT_PATH, c.chat_body)):
            async with app_client.post(path, headers=c.headers(ATTACKER),
                                       json=build("doomed", max_tokens=4)) as r:
                answers.append((path, r.status, await r.text(), r.headers["request-id"]))
        rest = await victim.text()
    victim_text = head.decode() + rest
    assert c.check_anthropic_stream(victim_text, VICTIM_TOKENS) is None
    assert not c.stream_ended_in_error(victim_text)
    for path, status, text, request_id in answers:
        assert status == 500, text
        body = json.loads(text)
        assert body["error"]["type"] == ("api_error" if path == c.ANTHROPIC_PATH
                                         else "server_error")
        message = body["error"]["message"]
        assert SECRET not in text and "RuntimeError" not in text
        assert message == f"internal error while generating (request id {request_id})"
        logged = [r for r in caplog.records if request_id in r.getMessage()]
        assert logged and logged[0].exc_info is not None
        assert SECRET in str(logged[0].exc_info[1])
