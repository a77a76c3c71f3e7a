"""Speculative decoding over real HTTP (``serve --spec ngram``, the tiny model): the
official SDKs' ``extra_body`` turns drafts off per request, a bad value is a 400 in each
API's error format, and the counts reach ``/v1/cache/stats`` and ``/metrics``."""
from __future__ import annotations

import anthropic
import openai
import pytest
import requests

from tests.support import client as c
from tests.support.engine import tiny_model
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

SPEC = ServerSpec(extra_args=("--spec", "ngram"), tenants=("spec_a",))


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


def spec_counts(server) -> dict:
    stats = requests.get(server.base_url + "/v1/cache/stats",
                         headers={"x-api-key": ADMIN_KEY}, timeout=30).json()
    return stats["spec"]


def repeat_one_token(client, **extra):
    """An answer that repeats one token (bias +100): its own text drafts it again."""
    token = tiny_model().tokenizer.encode(" cat")[-1]
    return client.completions.create(model="gpt-4o-mini", prompt="cat cat cat", max_tokens=24,
                                     temperature=0, logit_bias={str(token): 100},
                                     extra_body=extra)


def test_drafts_run_unless_a_request_turns_them_off(server):
    client = c.openai_client(server, "spec_a")
    before = spec_counts(server)
    off = repeat_one_token(client, speculative=False)
    assert spec_counts(server)["drafted"] == before["drafted"]
    on = repeat_one_token(client)
    after = spec_counts(server)
    assert after["accepted"] > before["accepted"] and after["verify_steps"] > 0
    assert on.choices[0].text == off.choices[0].text                   # the same answer
    assert on.usage.completion_tokens == off.usage.completion_tokens == 24
    assert 0.0 < after["acceptance_rate"] <= 1.0 and after["tokens_per_step"] > 1.0
    metrics = requests.get(server.base_url + "/metrics", headers={"x-api-key": ADMIN_KEY},
                           timeout=30).text
    assert "radixgate_spec_accepted_tokens_total" in metrics


def test_a_bad_switch_is_a_400_in_each_apis_format(server):
    client = c.openai_client(server, "spec_a")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-4o-mini", max_tokens=4,
                                       messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"speculative": "yes"})
    claude = anthropic.Anthropic(base_url=server.base_url, api_key=tenant_key("spec_a"),
                                 max_retries=0)
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="claude-sonnet-4-5", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}],
                               extra_body={"speculative": 1})
    answer = claude.messages.create(model="claude-sonnet-4-5", max_tokens=4,
                                    messages=[{"role": "user", "content": "hi"}],
                                    extra_body={"speculative": False})
    assert answer.usage.output_tokens >= 1


def test_n_choices_each_draft_and_answer_alike(server):
    client = c.openai_client(server, "spec_a")
    token = tiny_model().tokenizer.encode(" dog")[-1]
    before = spec_counts(server)
    answer = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "dog dog dog"}], n=2,
        max_tokens=16, temperature=0, logit_bias={str(token): 100})
    texts = [choice.message.content for choice in answer.choices]
    assert len(texts) == 2 and texts[0] == texts[1] and texts[0].count("dog") == 16
    assert answer.usage.completion_tokens == 32
    assert spec_counts(server)["accepted"] > before["accepted"]
