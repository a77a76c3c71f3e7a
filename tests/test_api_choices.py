"""Several choices through the official openai SDK over loopback (tiny model):
``n`` > 1 shares one prefill of the prompt (the other choices read it from the cache),
batched completion prompts give one choice per prompt in order, ``echo`` puts the prompt
first, and ``suffix`` is a clear 400."""
from __future__ import annotations

import uuid

import openai
import pytest

from tests.support import client as c
from tests.support.server import ADMIN_KEY, ServerSpec, shared_server, tenant_key

SPEC = ServerSpec(kv_cache_gb=0.004, max_model_len=512, tenants=("acme", "solo"))


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


@pytest.fixture(scope="module")
def gpt(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=tenant_key("acme"),
                         max_retries=0)


async def uncached_tokens(http, server, tenant: str) -> int:
    status, stats = await c.get_json(http, server.base_url + "/v1/cache/stats", ADMIN_KEY)
    return stats["tenants"].get(tenant, {}).get("tokens", {}).get("uncached", 0)


async def test_n_choices_prefill_the_prompt_once(http, server):
    solo = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=tenant_key("solo"),
                              max_retries=0)
    before = await uncached_tokens(http, server, "solo")
    prompt = f"A fresh prompt {uuid.uuid4().hex} " + "about caches " * 12
    chat = await solo.chat.completions.create(
        model="gpt-4o", n=4, max_tokens=6, temperature=1.0, seed=7,
        messages=[{"role": "user", "content": prompt}])
    assert [ch.index for ch in chat.choices] == [0, 1, 2, 3]
    computed = await uncached_tokens(http, server, "solo") - before
    # the first choice computes the prompt; each other one only its last token
    assert computed == chat.usage.prompt_tokens + 3, (computed, chat.usage)
    assert 4 <= chat.usage.completion_tokens <= 24          # all four answers, the prompt once


def test_seeded_choices_are_reproducible_and_differ(gpt):
    args = dict(model="gpt-4o", n=3, max_tokens=8, temperature=1.0, seed=11,
                messages=[{"role": "user", "content": "pick words"}])
    first = [ch.message.content for ch in gpt.chat.completions.create(**args).choices]
    again = [ch.message.content for ch in gpt.chat.completions.create(**args).choices]
    assert first == again and len(set(first)) > 1


def test_streamed_choices_carry_their_index(gpt):
    stream = gpt.chat.completions.create(model="gpt-4o", n=2, max_tokens=5, temperature=0,
                                         stream=True, stream_options={"include_usage": True},
                                         messages=[{"role": "user", "content": "hi there"}])
    texts, usage, finishes = {0: "", 1: ""}, None, {}
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts[0] == texts[1] and set(finishes) == {0, 1}     # greedy: the same answer
    assert usage.completion_tokens > 0 and usage.completion_tokens % 2 == 0   # both, alike


def test_batched_prompts_give_one_choice_each_in_order(gpt):
    prompts = ["The first prompt", "A second one, longer than the first", "Third"]
    batch = gpt.completions.create(model="gpt-4o", prompt=prompts, max_tokens=4, temperature=0)
    assert [ch.index for ch in batch.choices] == [0, 1, 2]
    alone = [gpt.completions.create(model="gpt-4o", prompt=p, max_tokens=4, temperature=0)
             for p in prompts]
    assert [ch.text for ch in batch.choices] == [a.choices[0].text for a in alone]
    assert batch.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    tokens = gpt.completions.create(model="gpt-4o", prompt=[[1000, 1001], [1002]], max_tokens=2,
                                    n=2, temperature=0)
    assert [ch.index for ch in tokens.choices] == [0, 1, 2, 3]


def test_echo_puts_the_prompt_first_and_suffix_is_a_400(gpt):
    out = gpt.completions.create(model="gpt-4o", prompt="Echo me", max_tokens=3, temperature=0,
                                 echo=True)
    assert out.choices[0].text.startswith("Echo me")
    stream = gpt.completions.create(model="gpt-4o", prompt="Echo me", max_tokens=3,
                                    temperature=0, echo=True, stream=True)
    assert "".join(ch.text for chunk in stream for ch in chunk.choices) == out.choices[0].text
    with pytest.raises(openai.BadRequestError) as info:
        gpt.completions.create(model="gpt-4o", prompt="x", suffix="y", max_tokens=2)
    assert "suffix" in str(info.value)
