"""OpenAI API against the real server (``radixgate serve --tiny``), driven by the official
``openai`` SDK: cached_tokens across calls, streaming with include_usage, completions from
text and token ids, cache_salt namespaces, cache_control parts, models and errors."""
from __future__ import annotations


import openai
import pytest

from tests.support import client as c
from tests.support.server import ServerSpec, shared_server

# Own tenants (and so its own server, shared by the tests/test_api_*.py modules): other
# suites' pins and flushes on the default spec's tenants cannot disturb these, nor these them.
# pins are shared out per tenant (ceiling / 5 entries): 8 MB of KV gives each ~1600 tokens
SPEC = ServerSpec(tenants=("gw_one", "gw_two", "org_1", "org_12345"), max_pinned_tokens=4096,
                  kv_cache_gb=0.008)
MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


def make_client(server, tenant: str = "gw_two") -> openai.OpenAI:
    return c.openai_client(server, tenant)


@pytest.fixture(scope="module")
def client(server):
    return make_client(server)


def unique_text(words: int = 40) -> str:
    return c.unique_text(words)


def chat(client, system: str, question: str, **kwargs):
    return client.chat.completions.create(
        model=MODEL, max_tokens=kwargs.pop("max_tokens", 4), temperature=0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        **kwargs)


def test_repeated_system_prompt_reports_cached_tokens(client):
    system = unique_text()
    first = chat(client, system, "one?")
    second = chat(client, system, "two, a different question?")
    assert first.usage.prompt_tokens_details.cached_tokens < 20
    assert second.usage.prompt_tokens_details.cached_tokens > 40
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens
    assert first.id.startswith("chatcmpl-") and first.object == "chat.completion"
    assert first.choices[0].finish_reason in ("length", "stop")


def test_stream_with_include_usage_ends_with_a_usage_chunk(client):
    system = unique_text(20)
    stream = client.chat.completions.create(
        model=MODEL, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "hi"}])
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens <= 5
    finish = [c.choices[0].finish_reason for c in chunks[:-1] if c.choices[0].finish_reason]
    assert finish in (["length"], ["stop"])
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    again = chat(client, system, "hi", max_tokens=5)
    assert again.choices[0].message.content == text       # greedy: same text either way
    assert again.usage.prompt_tokens_details.cached_tokens >= last.usage.prompt_tokens - 1


def test_max_completion_tokens_bounds_the_output(client):
    reply = client.chat.completions.create(model=MODEL, max_completion_tokens=3,
                                           messages=[{"role": "user", "content": "count"}])
    assert reply.usage.completion_tokens <= 3


def test_completions_take_text_or_token_ids_and_hit_the_cache(client):
    prompt = unique_text(30)
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0)
    tokens_prompt_len = first.usage.prompt_tokens
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens == tokens_prompt_len - 1
    assert second.choices[0].text == first.choices[0].text
    ids = client.completions.create(model=MODEL, prompt=[1, 2, 3, 4, 5], max_tokens=2)
    assert ids.usage.prompt_tokens == 5 and ids.object == "text_completion"


def test_cache_salt_separates_namespaces_within_a_tenant(client):
    system = unique_text(30)
    chat(client, system, "q", extra_body={"cache_salt": "salt-a"})
    same_salt = chat(client, system, "q", extra_body={"cache_salt": "salt-a"})
    other_salt = chat(client, system, "q", extra_body={"cache_salt": "salt-b"})
    no_salt = chat(client, system, "q")
    assert same_salt.usage.prompt_tokens_details.cached_tokens > 40
    assert other_salt.usage.prompt_tokens_details.cached_tokens < 20
    assert no_salt.usage.prompt_tokens_details.cached_tokens < 20


def test_prompt_cache_key_is_only_a_routing_hint(server):
    system = unique_text(30)
    a = make_client(server, "gw_two")
    chat(a, system, "q", extra_body={"prompt_cache_key": "shared-key"})
    other = chat(make_client(server, "gw_one"), system, "q",
                 extra_body={"prompt_cache_key": "shared-key"})
    mine = chat(a, system, "q", extra_body={"prompt_cache_key": "different-key"})
    assert other.usage.prompt_tokens_details.cached_tokens < 20       # never joins tenants
    assert mine.usage.prompt_tokens_details.cached_tokens > 40        # never splits a tenant


def test_cache_control_on_content_part_is_accepted_as_breakpoint(client):
    part = {"type": "text", "text": unique_text(20), "cache_control": {"type": "ephemeral"}}
    reply = client.chat.completions.create(model=MODEL, max_tokens=2, messages=[
        {"role": "user", "content": [part, {"type": "text", "text": "question"}]}])
    assert reply.usage.prompt_tokens > 20
    bad = dict(part, cache_control={"type": "ephemeral", "ttl": "2h"})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "user", "content": [bad]}])


def test_models_lists_the_served_model_and_resolves_aliases(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == ["smollm2-135m-instruct"]
    assert client.models.retrieve("gpt-4o").id == "smollm2-135m-instruct"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("mistral-7b")


@pytest.mark.parametrize("kwargs, status", [
    ({"n": 17}, 400),          # at most 16 choices
    ({"model": "mistral-7b"}, 404),
    ({"max_tokens": 0}, 400),
    ({"messages": [{"role": "user", "content": "word " * 100_000}]}, 400),   # too long
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}]}]}, 400),
])
def test_openai_errors_use_the_openai_envelope(client, kwargs, status):
    args = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}],
            **kwargs}
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**args)
    assert info.value.status_code == status
    error = info.value.body
    assert set(error) >= {"message", "type", "param", "code"} and error["message"]
