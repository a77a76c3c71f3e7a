"""Anthropic Messages API against the real server (``radixgate serve --tiny``), driven by the
official ``anthropic`` SDK: breakpoint usage arithmetic across calls, TTL split, automatic
caching, streaming event order, breakpoint and content errors."""
from __future__ import annotations

import uuid

import anthropic
import pytest

from tests.support.server import ServerSpec, shared_server, tenant_key

# Own tenants (and so its own server, shared by the tests/test_api_*.py modules): other
# suites' pins and flushes on the default spec's tenants cannot disturb these, nor these them.
# pins are shared out per tenant (ceiling / 5 entries): 8 MB of KV gives each ~1600 tokens
SPEC = ServerSpec(tenants=("gw_one", "gw_two", "org_1", "org_12345"), max_pinned_tokens=4096,
                  kv_cache_gb=0.008)
MODEL = "claude-3-5-haiku-latest"


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key=tenant_key("gw_one"),
                               max_retries=0, timeout=60)


def unique_text(words: int = 40) -> str:
    nonce = uuid.uuid4().hex
    return f"Reference {nonce}: " + " ".join(f"item{i}-{nonce[i % 32]}" for i in range(words))


def cc(ttl: str = "5m") -> dict:
    return {"type": "ephemeral", "ttl": ttl}


def total(usage) -> int:
    return usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens


def test_second_call_reads_what_the_first_created_and_usage_adds_up(client):
    system = [{"type": "text", "text": unique_text(), "cache_control": cc()}]
    args = dict(model=MODEL, system=system, max_tokens=4, extra_body={"temperature": 0})
    first_msgs = [{"role": "user", "content": "First question?"}]
    first = client.messages.create(messages=first_msgs, **args)
    u1 = first.usage
    # at most the template's head ("<|im_start|>system\n"), cached by this tenant's earlier
    # requests when other modules share the server
    assert u1.cache_read_input_tokens <= len("<|im_start|>system\n")
    assert u1.cache_creation_input_tokens > 40
    assert u1.cache_creation.ephemeral_5m_input_tokens == u1.cache_creation_input_tokens
    assert u1.cache_creation.ephemeral_1h_input_tokens == 0
    count1 = client.messages.count_tokens(model=MODEL, system=system, messages=first_msgs)
    assert total(u1) == count1.input_tokens
    second_msgs = [{"role": "user", "content": "A different, longer second question?"}]
    second = client.messages.create(messages=second_msgs, **args)
    u2 = second.usage
    assert u2.cache_read_input_tokens >= u1.cache_read_input_tokens + u1.cache_creation_input_tokens
    assert u2.cache_creation_input_tokens == 0
    count2 = client.messages.count_tokens(model=MODEL, system=system, messages=second_msgs)
    assert total(u2) == count2.input_tokens
    assert first.id.startswith("msg_") and first.id != second.id
    assert first.stop_reason in ("max_tokens", "end_turn") and first.usage.output_tokens <= 4


def test_1h_tool_breakpoint_and_5m_system_breakpoint_split_creation_by_ttl(client):
    tools = [{"name": "lookup", "description": unique_text(20),
              "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
              "cache_control": cc("1h")}]
    system = [{"type": "text", "text": unique_text(20), "cache_control": cc("5m")}]
    msg = client.messages.create(model=MODEL, tools=tools, system=system, max_tokens=2,
                                 messages=[{"role": "user", "content": "go"}])
    u = msg.usage
    assert u.cache_creation.ephemeral_1h_input_tokens > 20
    assert u.cache_creation.ephemeral_5m_input_tokens > 20
    assert (u.cache_creation.ephemeral_1h_input_tokens + u.cache_creation.ephemeral_5m_input_tokens
            == u.cache_creation_input_tokens)
    assert u.cache_read_input_tokens < 20        # at most the shared template/tools header


def test_top_level_cache_control_caches_the_conversation_for_the_next_turn(client):
    turn1 = [{"role": "user", "content": unique_text(30)}]
    first = client.messages.create(model=MODEL, max_tokens=3, messages=turn1,
                                   cache_control=cc())
    assert first.usage.cache_creation_input_tokens > 30
    reply = "".join(b.text for b in first.content if b.type == "text") or "ok"
    turn2 = turn1 + [{"role": "assistant", "content": reply.strip() or "ok"},
                     {"role": "user", "content": "And then?"}]
    second = client.messages.create(model=MODEL, max_tokens=3, messages=turn2)
    assert second.usage.cache_read_input_tokens >= first.usage.cache_creation_input_tokens


def test_longest_cached_prefix_is_reused_without_breakpoints(client):
    messages = [{"role": "user", "content": unique_text(30)}]
    first = client.messages.create(model=MODEL, max_tokens=2, messages=messages)
    second = client.messages.create(model=MODEL, max_tokens=2, messages=messages)
    assert first.usage.cache_creation_input_tokens == 0
    assert second.usage.cache_read_input_tokens >= total(first.usage) - 1
    assert second.usage.input_tokens >= 1          # the last prompt token is recomputed


def test_stream_events_arrive_in_the_documented_order(client):
    system = [{"type": "text", "text": unique_text(20), "cache_control": cc()}]
    kwargs = dict(model=MODEL, system=system, max_tokens=6, extra_body={"temperature": 0},
                  messages=[{"role": "user", "content": "stream please"}])
    with client.messages.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_message()
    types = [e.type for e in events if e.type in (
        "message_start", "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop")]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    start = events[0].message.usage
    assert start.cache_creation_input_tokens > 20 and start.cache_read_input_tokens < 20
    body = types[1:-2]
    if body:   # one text block: start, deltas, stop
        assert body[0] == "content_block_start" and body[-1] == "content_block_stop"
        assert set(body[1:-1]) <= {"content_block_delta"}
    deltas = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert final.content[0].text == deltas if final.content else deltas == ""
    assert final.usage.output_tokens == 6 or final.stop_reason == "end_turn"
    assert total(final.usage) == total(start)
    again = client.messages.create(**kwargs)
    assert again.usage.cache_read_input_tokens >= start.cache_creation_input_tokens


@pytest.mark.parametrize("kwargs, fragment", [
    ({"system": [{"type": "text", "text": f"part {i}", "cache_control": cc()} for i in range(5)]},
     "maximum of 4"),
    ({"system": [{"type": "text", "text": "a", "cache_control": cc("5m")},
                 {"type": "text", "text": "b", "cache_control": cc("1h")}]}, "ttl='1h'"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "", "cache_control": cc()}, {"type": "text", "text": "x"}]}]},
     "empty text"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]},
     "'image' is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "text", "media_type": "text/plain", "data": "hello"}}]}]},
     "'document' is not supported"),
])
def test_invalid_breakpoints_and_content_get_anthropic_400s(client, kwargs, fragment):
    args = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
            **kwargs}
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(**args)
    assert info.value.status_code == 400
    body = info.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert fragment in body["error"]["message"]


def test_unknown_model_is_anthropic_404(client):
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="llama-3", max_tokens=2,
                               messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["error"]["type"] == "not_found_error"


def test_stop_sequences_and_sampling_params_are_accepted(client):
    # this SDK version sends temperature/top_p/top_k only through extra_body
    msg = client.messages.create(model=MODEL, max_tokens=5, stop_sequences=["\n\n"],
                                 metadata={"user_id": "u-1"},
                                 extra_body={"temperature": 0.7, "top_p": 0.9, "top_k": 20},
                                 messages=[{"role": "user", "content": "hello"}])
    assert msg.stop_reason in ("max_tokens", "end_turn", "stop_sequence")
    assert msg.usage.output_tokens <= 5
