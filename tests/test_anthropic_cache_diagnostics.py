"""Anthropic's cache diagnostics (anthropic/cache_diagnostics.py) through the official SDK's
own types, against the real server on the tiny model: ``diagnostics.previous_message_id``
answers ``cache_miss_reason`` (model, system, tools or earlier messages changed; a previous
message not found, another tenant's included; unavailable) with ``cache_missed_input_tokens``,
``null`` on a first turn and where only messages were appended, on ``message_start`` when
streaming; an unknown field inside ``diagnostics`` is a 400; a batch answers ``unavailable``."""
from __future__ import annotations

import time
import uuid

import anthropic
import pytest
from anthropic.types import (CacheMissMessagesChanged, CacheMissModelChanged,
                             CacheMissPreviousMessageNotFound, CacheMissSystemChanged,
                             CacheMissToolsChanged, CacheMissUnavailable, Message,
                             RawMessageStartEvent)

from tests.support.server import ServerSpec, shared_server, tenant_key

# the spec of tests/test_api_anthropic.py: one server for both modules
SPEC = ServerSpec(tenants=("gw_one", "gw_two", "org_1", "org_12345"), max_pinned_tokens=4096,
                  kv_cache_gb=0.008)
MODEL = "claude-3-5-haiku-latest"          # both served through the "claude-*" alias
OTHER_MODEL = "claude-sonnet-4-5"
FIRST_TURN = {"previous_message_id": None}


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


def sdk(server, tenant: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=tenant_key(tenant),
                               max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(server):
    return sdk(server, "gw_one")


def system_text() -> str:
    nonce = uuid.uuid4().hex
    return f"Reference {nonce}: " + " ".join(f"rule{i}-{nonce[i % 32]}" for i in range(30))


def tool(name: str) -> dict:
    return {"name": name, "description": f"Runs {name}.",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}


def turn(client, previous: str | None, *, system: str, messages: list, model: str = MODEL,
         **extra) -> Message:
    return client.messages.create(model=model, max_tokens=1, system=system, messages=messages,
                                  diagnostics={"previous_message_id": previous}, **extra)


def reason_of(message: Message):
    assert message.diagnostics is not None, message
    return message.diagnostics.cache_miss_reason


def prompt_tokens(message: Message) -> int:
    u = message.usage
    return u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens


QUESTION = [{"role": "user", "content": "What is a radix tree?"}]


def test_first_turn_is_null_and_appended_messages_are_no_change(client):
    system = system_text()
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=1, system=system, messages=QUESTION, diagnostics=FIRST_TURN)
    assert raw.http_response.json()["diagnostics"] is None
    first = raw.parse()
    second = turn(client, first.id, system=system, messages=QUESTION + [
        {"role": "assistant", "content": "A trie with merged edges."},
        {"role": "user", "content": "And its lookups?"}])
    assert second.diagnostics is None
    plain = client.messages.with_raw_response.create(model=MODEL, max_tokens=1, system=system,
                                                     messages=QUESTION)
    assert "diagnostics" not in plain.http_response.json()     # not asked for


def test_an_edited_earlier_message_is_messages_changed(client):
    system = system_text()
    first = turn(client, None, system=system, messages=QUESTION + [
        {"role": "assistant", "content": "A trie with merged edges."},
        {"role": "user", "content": "And its lookups?"}])
    edited = turn(client, first.id, system=system, messages=QUESTION + [
        {"role": "assistant", "content": "A compressed trie."},
        {"role": "user", "content": "And its lookups?"}])
    reason = reason_of(edited)
    assert isinstance(reason, CacheMissMessagesChanged)
    # the edited reply and what follows it, not the system prompt and first question
    assert 0 < reason.cache_missed_input_tokens < prompt_tokens(first) // 2


def test_system_tools_and_model_changes_are_named(client):
    system = system_text()
    first = turn(client, None, system=system, messages=QUESTION)
    changed = turn(client, first.id, system=system + " Updated.", messages=QUESTION)
    assert isinstance(reason_of(changed), CacheMissSystemChanged)
    whole = reason_of(changed).cache_missed_input_tokens        # the system is the first part
    assert prompt_tokens(first) - 10 < whole < prompt_tokens(first)
    with_tools = turn(client, first.id, system=system, messages=QUESTION,
                      tools=[tool("search"), tool("fetch")])
    assert isinstance(reason_of(with_tools), CacheMissToolsChanged)
    reordered = turn(client, with_tools.id, system=system, messages=QUESTION,
                     tools=[tool("fetch"), tool("search")])
    assert isinstance(reason_of(reordered), CacheMissToolsChanged)
    assert reason_of(reordered).cache_missed_input_tokens > whole    # the tools come first
    other_model = turn(client, first.id, system=system, messages=QUESTION, model=OTHER_MODEL)
    assert isinstance(reason_of(other_model), CacheMissModelChanged)
    assert reason_of(other_model).cache_missed_input_tokens == whole
    same = turn(client, first.id, system=system, messages=QUESTION)
    assert same.diagnostics is None


def test_an_unknown_or_another_tenants_message_is_not_found(server, client):
    system = system_text()
    mine = turn(client, None, system=system, messages=QUESTION)
    unknown = turn(client, "msg_" + uuid.uuid4().hex, system=system, messages=QUESTION)
    assert isinstance(reason_of(unknown), CacheMissPreviousMessageNotFound)
    theirs = turn(sdk(server, "gw_two"), mine.id, system=system, messages=QUESTION)
    assert isinstance(reason_of(theirs), CacheMissPreviousMessageNotFound)
    assert turn(client, mine.id, system=system, messages=QUESTION).diagnostics is None


def test_another_cache_salt_is_unavailable(client):
    system = system_text()
    first = turn(client, None, system=system, messages=QUESTION)
    salted = turn(client, first.id, system=system, messages=QUESTION,
                  extra_body={"cache_salt": "elsewhere"})
    assert isinstance(reason_of(salted), CacheMissUnavailable)


def test_a_stream_carries_it_on_message_start(client):
    system = system_text()
    first = turn(client, None, system=system, messages=QUESTION)
    events = list(client.messages.create(
        model=MODEL, max_tokens=2, system=system + " Streamed.", messages=QUESTION,
        diagnostics={"previous_message_id": first.id}, stream=True))
    start = events[0]
    assert isinstance(start, RawMessageStartEvent)
    assert isinstance(reason_of(start.message), CacheMissSystemChanged)
    assert events[-1].type == "message_stop"


def test_an_unknown_field_inside_diagnostics_is_a_400(client):
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=1, messages=QUESTION,
                               diagnostics={"previous_message_id": None, "verbose": True})
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "diagnostics.verbose" in info.value.body["error"]["message"]


def test_a_batch_request_answers_unavailable(client):
    first = turn(client, None, system=system_text(), messages=QUESTION)
    params = {"model": MODEL, "max_tokens": 1, "messages": QUESTION}
    made = client.messages.batches.create(requests=[
        {"custom_id": "compared", "params": {**params,
                                             "diagnostics": {"previous_message_id": first.id}}},
        {"custom_id": "first", "params": {**params, "diagnostics": FIRST_TURN}},
        {"custom_id": "bad", "params": {**params, "diagnostics": {"since": 1}}}])
    deadline = time.monotonic() + 120
    while client.messages.batches.retrieve(made.id).processing_status != "ended":
        assert time.monotonic() < deadline, "the batch never ended"
        time.sleep(0.05)
    got = {r.custom_id: r.result for r in client.messages.batches.results(made.id)}
    assert isinstance(reason_of(got["compared"].message), CacheMissUnavailable)
    assert got["first"].message.diagnostics is None
    assert got["bad"].type == "errored" and "diagnostics.since" in got["bad"].error.error.message
