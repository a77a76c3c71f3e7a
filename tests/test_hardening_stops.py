"""Stop-string limits over HTTP: at most 64 stop strings of at most
1,000 characters each; beyond, 400 in each API's envelope, naming the limit. At the limit
the request is served."""
from __future__ import annotations

import json

import pytest

from radixgate.runtime.engine.stop import MAX_STOP_LENGTH, MAX_STOP_STRINGS
from tests.support import client as c
from tests.support.server import ServerSpec, shared_server, tenant_key

ACME = tenant_key("acme")


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, ServerSpec())


def body_with_stops(path: str, stops: list[str], **extra) -> dict:
    if path == c.ANTHROPIC_PATH:
        return c.anthropic_body("say something", max_tokens=8, stop_sequences=stops, **extra)
    return c.chat_body("say something", max_tokens=8, stop=stops, **extra)


def distinct_stops(count: int, length: int) -> list[str]:
    """Stop strings the tiny model will not write (a rare character, then a number)."""
    return [(f"\u2603{i}:" + "\u00a7" * length)[:length] for i in range(count)]


@pytest.mark.parametrize("path", [c.ANTHROPIC_PATH, c.CHAT_PATH])
@pytest.mark.parametrize("stops, limit", [
    (distinct_stops(MAX_STOP_STRINGS + 1, 8), MAX_STOP_STRINGS),
    (distinct_stops(1, MAX_STOP_LENGTH + 1), MAX_STOP_LENGTH)], ids=["65 stops", "1001 chars"])
@pytest.mark.parametrize("stream", [False, True])
async def test_stops_over_the_limits_are_refused_in_the_apis_envelope(http, server, path,
                                                                     stops, limit, stream):
    status, answer = await c.post_json(http, server.base_url + path, ACME,
                                       body_with_stops(path, stops, stream=stream))
    assert status == 400, answer
    assert c.check_error_envelope(c.api_of(path), status, json.dumps(answer)) is None
    message = answer["error"]["message"]
    assert "stop string" in message and str(limit) in message, message


@pytest.mark.parametrize("path", [c.ANTHROPIC_PATH, c.CHAT_PATH])
async def test_the_most_and_longest_stops_allowed_are_served(http, server, path):
    stops = distinct_stops(MAX_STOP_STRINGS, MAX_STOP_LENGTH)
    assert {len(s) for s in stops} == {MAX_STOP_LENGTH}
    status, answer = await c.post_json(http, server.base_url + path, ACME,
                                       body_with_stops(path, stops))
    assert status == 200, answer
    assert c.check_answer(path, False, status, json.dumps(answer), 8) is None
