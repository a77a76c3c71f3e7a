"""The deterministic mode as a user meets it: ``radixgate serve --deterministic`` with the
default model, the official openai SDK over loopback. A ~410-token prompt at temperature 0
with the top-20 logprobs, sent cold, then again with 400+ tokens cached, then cached beside
another tenant's request in the same steps: every token and every logprob the same bits.
(Without the mode the first answer token's logprob moved from -0.3166 cold to -0.3003 cached.)
"""
from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.client import openai_client
from tests.support.server import ServerSpec, shared_server

SPEC = ServerSpec(tiny=False, kv_cache_gb=0.05, max_model_len=1024, tenants=("alpha", "beta"),
                  extra_args=("--deterministic",))
WORDS = ("harbor lantern quarry meadow violet ember cobalt saddle thistle canyon orbit "
         "pebble marble willow falcon copper signal garden rocket velvet").split()


@pytest.fixture(scope="module")
def server(pytestconfig):
    return shared_server(pytestconfig, SPEC)


def ask(client, text: str):
    return client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": text}], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=20)


def positions(answer) -> list[tuple]:
    return [(p.token, p.logprob, [(t.token, t.logprob) for t in p.top_logprobs])
            for p in answer.choices[0].logprobs.content]


def test_cold_cached_and_batched_answers_have_the_same_logprob_bits(server):
    rng = random.Random(34)
    text = "Summarize this log in one line: " + " ".join(rng.choice(WORDS) for _ in range(380))
    other = "Name a color: " + " ".join(rng.choice(WORDS) for _ in range(150))
    alpha, beta = openai_client(server, "alpha"), openai_client(server, "beta")
    cold = ask(alpha, text)
    assert cold.usage.prompt_tokens > 400
    assert (cold.usage.prompt_tokens_details.cached_tokens or 0) == 0
    cached = ask(alpha, text)
    assert cached.usage.prompt_tokens_details.cached_tokens >= 400
    with ThreadPoolExecutor(2) as pool:                  # the same steps as another tenant's
        batched, _ = pool.map(lambda job: ask(*job), [(alpha, text), (beta, other)])
    want = positions(cold)
    assert len(want) == 6 and all(len(top) == 20 for _, _, top in want)
    assert positions(cached) == want
    assert positions(batched) == want
