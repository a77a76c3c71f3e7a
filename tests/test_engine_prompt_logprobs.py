"""Prompt log probabilities (engine, tiny model): the value reported for prompt token p is
the model's log probability of that token after tokens[:p], the same the engine reports as
an output token's logprob when tokens[:p] is the prompt and token p is forced."""
import pytest

from radixgate.runtime.engine.api import Request, SamplingParams
from tests.support.engine_compare import assert_clean

PROMPT = [3000 + (7 * i) % 200 for i in range(40)]


def test_prompt_logprobs_equal_the_forced_next_token_logprob(make_engine):
    engine = make_engine(prefill_chunk=16)                 # the prompt spans three chunks
    full = engine.generate(Request(list(PROMPT), SamplingParams(
        max_tokens=1, temperature=0.0, prompt_logprobs=2)))
    entries = full.prompt_logprobs
    assert len(entries) == len(PROMPT) and entries[0] is None
    assert [e.token_id for e in entries[1:]] == PROMPT[1:]
    assert all(len(e.top) == 2 for e in entries[1:])
    for p in (1, 15, 16, 17, 39):
        forced = engine.generate(Request(PROMPT[:p], SamplingParams(
            max_tokens=1, temperature=0.0, logprobs=0, logit_bias=((PROMPT[p], 100.0),))))
        (got,) = forced.logprobs
        assert got.token_id == PROMPT[p]
        assert got.logprob == pytest.approx(entries[p].logprob, abs=1e-3), p
    assert_clean(engine)


def test_a_prompt_logprobs_request_reuses_no_cached_prefix(make_engine):
    engine = make_engine()
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    engine.generate(Request(list(PROMPT), SamplingParams(max_tokens=1, temperature=0.0)))
    again = engine.generate(Request(list(PROMPT), params))
    assert again.usage.cache_read_tokens == 0 and len(again.prompt_logprobs) == len(PROMPT)
    assert_clean(engine)


def test_prompt_logprobs_prefill_in_small_chunks(make_engine):
    """Each prompt row costs an output-layer pass: such a request adds a bounded amount of
    work to every step it shares with other requests."""
    from radixgate.runtime.engine.scheduler import PROMPT_LOGPROBS_CHUNK
    engine = make_engine()
    prompt = [3000 + i for i in range(100)]

    def prefill_steps(params: SamplingParams) -> int:
        before = engine.request_snapshot().result().steps
        engine.generate(Request(list(prompt), params))
        return engine.request_snapshot().result().steps - before

    plain = prefill_steps(SamplingParams(max_tokens=1, temperature=0.0))
    chunked = prefill_steps(SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0))
    assert plain == 1
    assert chunked == -(-len(prompt) // PROMPT_LOGPROBS_CHUNK)
    assert_clean(engine)
