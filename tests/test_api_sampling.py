"""Sampling fields over real HTTP: ``logit_bias``, ``min_tokens``, ``ignore_eos``,
presence / frequency / repetition penalties, ``min_p`` and ``top_k`` reach the sampler
through the official openai SDK (``extra_body`` for vLLM's extras) and the Anthropic route,
change the answer the way they should, and out-of-range values get a 400."""
from __future__ import annotations

import openai
import pytest

from tests.support import client as c
from tests.support.engine import tiny_model
from tests.support.server import ServerSpec, shared_server, tenant_key

MODEL = "gpt-4o-mini"
PROMPT = "The quick brown fox jumps over the lazy dog and the cache"


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, ServerSpec())


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=tenant_key("gamma"),
                         max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_model().tokenizer


@pytest.fixture(scope="module")
def eos_bias(tokenizer):
    """A logit_bias that makes the model end at once (every EOS id +100)."""
    return {str(t): 100 for t in tokenizer.eos_token_ids}


def complete(client, **kwargs):
    kwargs.setdefault("max_tokens", 8)
    kwargs.setdefault("temperature", 0)
    return client.completions.create(model=MODEL, prompt=PROMPT, **kwargs)


def chat(client, **kwargs):
    kwargs.setdefault("max_tokens", 8)
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], **kwargs)


def distinct_tokens(tokenizer, text: str) -> int:
    return len(set(tokenizer.encode(text)))


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_logit_bias_of_100_makes_every_output_token_that_token(client, tokenizer, temperature):
    token = tokenizer.encode(" cat")[-1]
    piece = tokenizer.decode([token])
    answer = chat(client, temperature=temperature, logit_bias={str(token): 100})
    assert answer.choices[0].message.content == piece * 8
    assert answer.usage.completion_tokens == 8 and answer.choices[0].finish_reason == "length"
    text = complete(client, temperature=temperature, logit_bias={str(token): 100}).choices[0].text
    assert text == piece * 8


def test_min_tokens_keeps_going_past_eos(client, eos_bias):
    ends = complete(client, logit_bias=eos_bias)
    assert ends.usage.completion_tokens == 1 and ends.choices[0].text == ""
    kept = complete(client, logit_bias=eos_bias, max_tokens=12,
                    extra_body={"min_tokens": 5, "ignore_eos": False})
    assert kept.choices[0].finish_reason == "stop"          # EOS right after min_tokens
    assert kept.usage.completion_tokens == 6 and kept.choices[0].text
    chat_kept = chat(client, logit_bias=eos_bias, max_tokens=12, extra_body={"min_tokens": 5})
    assert chat_kept.usage.completion_tokens == 6


def test_ignore_eos_reaches_the_engine(client, eos_bias):
    answer = complete(client, logit_bias=eos_bias, max_tokens=7, extra_body={"ignore_eos": True})
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == 7
    streamed = chat(client, logit_bias=eos_bias, max_tokens=7, stream=True,
                    stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(streamed)
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 7


def test_stop_strings_do_not_end_the_answer_within_min_tokens(client):
    baseline = complete(client, max_tokens=6).choices[0].text
    stop = baseline.split()[0]                  # the first word: it ends the answer at once
    assert complete(client, stop=[stop]).choices[0].text.count(stop) == 0
    held = complete(client, stop=[stop], max_tokens=6, extra_body={"min_tokens": 3})
    assert stop in held.choices[0].text and baseline.startswith(held.choices[0].text)
    assert held.usage.completion_tokens > 3 and held.choices[0].finish_reason == "stop"


def streamed_pieces(client, **kwargs) -> list[str]:
    """The answer's text deltas: one per token here (ASCII-safe pieces, no stop strings)."""
    stream = chat(client, max_tokens=32, stream=True, **kwargs)
    return [ch.choices[0].delta.content for ch in stream
            if ch.choices and ch.choices[0].delta.content]


@pytest.mark.parametrize("penalty", ["presence_penalty", "frequency_penalty"])
def test_penalties_turn_a_greedy_answer_away_from_a_repeat(client, penalty):
    """Greedy with and without the penalty agree until the penalty first changes a pick:
    there the unpenalised answer repeats one of its own earlier tokens."""
    plain = streamed_pieces(client, extra_body={"ignore_eos": True})
    penalised = streamed_pieces(client, **{penalty: 2.0}, extra_body={"ignore_eos": True})
    assert penalised != plain
    first = next(i for i, (a, b) in enumerate(zip(plain, penalised)) if a != b)
    assert plain[first] in plain[:first]


@pytest.mark.parametrize("penalty", [{"frequency_penalty": 2.0},
                                     {"extra_body": {"repetition_penalty": 1.5}}])
def test_penalties_make_a_greedy_answer_repeat_less(client, tokenizer, penalty):
    plain = chat(client, max_tokens=32, extra_body={"ignore_eos": True})
    penalised = chat(client, max_tokens=32, **{**penalty, "extra_body": {
        "ignore_eos": True, **penalty.get("extra_body", {})}})
    plain_text = plain.choices[0].message.content
    penalised_text = penalised.choices[0].message.content
    assert distinct_tokens(tokenizer, penalised_text) > distinct_tokens(tokenizer, plain_text)


def test_min_p_and_top_k_of_one_are_greedy_at_any_temperature(client):
    greedy = complete(client).choices[0].text
    for extra in ({"min_p": 1.0}, {"top_k": 1}):
        assert complete(client, temperature=1.5, seed=3, extra_body=extra).choices[0].text == greedy


@pytest.mark.parametrize("fields, param", [
    ({"logit_bias": {"10000000": 5}}, None),
    ({"logit_bias": {"abc": 5}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, None),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"extra_body": {"min_p": 1.5}}, "min_p"),
    ({"extra_body": {"min_tokens": 9}, "max_tokens": 8}, None),
])
def test_out_of_range_sampling_values_get_a_400(client, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, **fields)
    if param is not None:
        assert param in str(info.value)


async def test_messages_take_the_vllm_extras(server, http, tokenizer):
    url = server.base_url + c.ANTHROPIC_PATH

    async def answer(**extra):
        body = c.anthropic_body(PROMPT, max_tokens=24, **extra)
        async with http.post(url, headers=c.headers(tenant_key("gamma")), json=body) as r:
            return r.status, await r.json()

    status, plain = await answer(ignore_eos=True)
    assert status == 200 and plain["stop_reason"] == "max_tokens"
    status, penalised = await answer(ignore_eos=True, repetition_penalty=1.5, top_k=5, min_p=0.1)
    assert status == 200
    plain_text, penalised_text = plain["content"][0]["text"], penalised["content"][0]["text"]
    assert distinct_tokens(tokenizer, penalised_text) > distinct_tokens(tokenizer, plain_text)
    status, error = await answer(min_tokens=25)
    assert status == 400 and "min_tokens" in error["error"]["message"]
