"""Log probabilities through the official openai SDK over loopback (tiny model):
chat ``logprobs`` / ``top_logprobs`` and completions ``logprobs``, streamed and not, taken
from the model's own distribution (so greedy picks are each step's most likely token)."""
from __future__ import annotations

import math

import openai
import pytest

from tests.support.server import ServerSpec, shared_server, tenant_key

SPEC = ServerSpec(kv_cache_gb=0.004, max_model_len=512, tenants=("acme",))
MESSAGES = [{"role": "user", "content": "Say something about radix trees."}]


@pytest.fixture(scope="module")
def gpt(pytestconfig):
    server = shared_server(pytestconfig, SPEC)
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=tenant_key("acme"),
                         max_retries=0)


def check_entry(entry, top_n: int) -> None:
    assert entry.logprob <= 0 and len(entry.top_logprobs) == top_n
    tops = [t.logprob for t in entry.top_logprobs]
    assert tops == sorted(tops, reverse=True)
    assert sum(math.exp(lp) for lp in tops) <= 1 + 1e-4
    assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_chat_logprobs_cover_every_output_token_and_greedy_picks_the_top(gpt):
    chat = gpt.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=12,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert "".join(e.token for e in content) == chat.choices[0].message.content
    for entry in content:
        check_entry(entry, 3)
        assert entry.token == entry.top_logprobs[0].token           # greedy: the argmax
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)


def test_streamed_chat_logprobs_add_up_to_the_answer(gpt):
    stream = gpt.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=12,
                                         temperature=0, logprobs=True, top_logprobs=1,
                                         stream=True, stream_options={"include_usage": True})
    text, entries, usage = "", [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                entries += choice.logprobs.content
    assert len(entries) == usage.completion_tokens
    assert "".join(e.token for e in entries) == text


def test_completions_logprobs_in_the_legacy_shape(gpt):
    out = gpt.completions.create(model="gpt-4o", prompt="The radix tree", max_tokens=8,
                                 temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert "".join(lp.tokens) == out.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == out.usage.completion_tokens
    assert all(len(top) <= 2 for top in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    stream = gpt.completions.create(model="gpt-4o", prompt="The radix tree", max_tokens=8,
                                    temperature=0, logprobs=2, stream=True)
    tokens = [t for chunk in stream for choice in chunk.choices if choice.logprobs
              for t in choice.logprobs.tokens]
    assert tokens == lp.tokens                        # greedy: the same answer, token by token


def test_sampled_tokens_report_their_own_logprob(gpt):
    chat = gpt.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=10,
                                       temperature=1.0, seed=3, logprobs=True, top_logprobs=20)
    for entry in chat.choices[0].logprobs.content:
        check_entry(entry, 20)
        listed = {t.token: t.logprob for t in entry.top_logprobs}
        if entry.token in listed:
            assert entry.logprob == pytest.approx(listed[entry.token], abs=1e-5)


@pytest.mark.parametrize("kwargs", [{"top_logprobs": 3}, {"logprobs": True, "top_logprobs": 21}])
def test_bad_logprob_requests_are_400(gpt, kwargs):
    with pytest.raises(openai.BadRequestError):
        gpt.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2, **kwargs)


def test_echo_with_logprobs_reports_the_prompt_tokens_first(gpt):
    prompt = "Radix trees share prefixes"
    out = gpt.completions.create(model="gpt-4o", prompt=prompt, max_tokens=4, temperature=0,
                                 echo=True, logprobs=1)
    lp = out.choices[0].logprobs
    assert out.choices[0].text.startswith(prompt)
    assert "".join(lp.tokens) == out.choices[0].text
    n_prompt = out.usage.prompt_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert len(lp.tokens) == n_prompt + out.usage.completion_tokens
    again = gpt.completions.create(model="gpt-4o", prompt=prompt, max_tokens=4, temperature=0,
                                   echo=True, logprobs=1)
    # the prompt's logits are not cached, so it is computed again, giving the same values
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].logprobs.token_logprobs[1:] == pytest.approx(
        lp.token_logprobs[1:], abs=1e-4)
