"""The batched sampler against a plain per-row torch reference: logit_bias,
min_tokens, repetition / frequency / presence penalties, temperature, min_p, top_k, top_p,
each alone and all together, rows with different values in one batch, on random logits and
on the tiny model's real logits; seeded draws are the reference's inverse-CDF draws."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgate.runtime.engine.api import SamplingParams
from radixgate.runtime.model.batch import build_forward_batch
from radixgate.runtime.model.kv_cache import KVCache
from radixgate.runtime.engine.sampling import (MIN_TEMPERATURE, TOP_P_CANDIDATES, TokenCounts,
                                        make_generator, sample_tokens, token_distribution,
                                        validate_sampling)

VOCAB = 300
EOS = (2, 7)
NEG_INF = float("-inf")


# -- the reference: one row at a time, written as the definitions read ---------------------

def reference_logits(row: torch.Tensor, p: SamplingParams, prompt: list[int],
                     output: list[int]) -> torch.Tensor:
    x = row.double().clone()
    x[x.isnan()] = NEG_INF
    for token, bias in p.logit_bias:
        x[token] += bias
    if len(output) < p.min_tokens:
        for token in set(p.stop_token_ids) | (set() if p.ignore_eos else set(EOS)):
            x[token] = NEG_INF
    for token in set(prompt) | set(output):
        if p.repetition_penalty != 1.0:
            value = x[token]
            x[token] = value / p.repetition_penalty if value > 0 else value * p.repetition_penalty
    for token, count in Counter(output).items():
        x[token] -= p.frequency_penalty * count + p.presence_penalty
    return x


def reference_distribution(row: torch.Tensor, p: SamplingParams, prompt: list[int],
                           output: list[int]) -> torch.Tensor:
    x = reference_logits(row, p, prompt, output)
    if p.temperature < MIN_TEMPERATURE or not torch.isfinite(x.max()):
        return torch.nn.functional.one_hot(x.argmax(), VOCAB).double()
    probs = torch.softmax(x / p.temperature, dim=0)
    if p.min_p > 0:
        probs[probs < p.min_p * probs.max()] = 0.0
    if 0 < p.top_k < VOCAB:
        kth = torch.sort(probs, descending=True).values[p.top_k - 1]
        probs[probs < kth] = 0.0
    probs = probs / probs.sum()
    if p.top_p < 1.0:
        mass_before = 0.0                 # of the more likely tokens, kept or not
        for token in torch.argsort(probs, descending=True, stable=True).tolist():
            value = float(probs[token])
            if mass_before >= p.top_p:
                probs[token] = 0.0
            mass_before += value
    return probs / probs.sum()


def reference_draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Inverse CDF with the generator's next uniform: the first token whose mass passes it."""
    u = float(torch.rand(1, generator=generator))
    return int(torch.searchsorted(probs.float().cumsum(0), torch.tensor([u]), right=True)
               .clamp(max=VOCAB - 1))


# -- helpers -------------------------------------------------------------------------------

ALL_ON = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02, seed=5,
                        presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.3,
                        logit_bias=((3, 5.0), (11, -100.0), (12, 2.5)), min_tokens=4)
EACH = {
    "greedy": SamplingParams(temperature=0.0),
    "plain": SamplingParams(temperature=1.0, seed=1),
    "logit_bias": SamplingParams(temperature=1.0, logit_bias=((5, 3.0), (9, -7.5)), seed=2),
    "min_tokens": SamplingParams(temperature=1.0, min_tokens=10, stop_token_ids=(4,), seed=3),
    "ignore_eos_min_tokens": SamplingParams(temperature=1.0, min_tokens=10, ignore_eos=True,
                                            stop_token_ids=(4,), seed=3),
    "repetition": SamplingParams(temperature=1.0, repetition_penalty=1.8, seed=4),
    "repetition_below_one": SamplingParams(temperature=1.0, repetition_penalty=0.5, seed=4),
    "frequency": SamplingParams(temperature=1.0, frequency_penalty=1.5, seed=5),
    "presence": SamplingParams(temperature=1.0, presence_penalty=-1.2, seed=6),
    "temperature": SamplingParams(temperature=0.3, seed=7),
    "min_p": SamplingParams(temperature=1.0, min_p=0.2, seed=8),
    "top_k": SamplingParams(temperature=1.0, top_k=7, seed=9),
    "top_p": SamplingParams(temperature=1.0, top_p=0.6, seed=10),
    "greedy_penalised": SamplingParams(temperature=0.0, frequency_penalty=2.0,
                                       repetition_penalty=1.5, logit_bias=((1, 1.0),)),
    "all": ALL_ON,
}


def random_logits(rows: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


def random_history(seed: int, prompt_len: int = 30, output_len: int = 12) -> tuple[list, list]:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, VOCAB, (prompt_len,), generator=g).tolist()
    output = torch.randint(0, 40, (output_len,), generator=g).tolist()   # repeats likely
    return prompt, output


def assert_matches_reference(logits, params, histories):
    counts = [TokenCounts(prompt + output, len(prompt)) for prompt, output in histories]
    batched = token_distribution(logits, params, counts, EOS)
    for row, (p, (prompt, output)) in enumerate(zip(params, histories)):
        expected = reference_distribution(logits[row], p, prompt, output).float()
        torch.testing.assert_close(batched[row], expected, atol=2e-5, rtol=1e-4,
                                   msg=lambda m: f"row {row} ({p}): {m}")


# -- distributions -------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(EACH))
def test_each_transform_alone_matches_the_reference(name):
    logits = random_logits(3, seed=len(name))
    histories = [random_history(i) for i in range(3)]
    assert_matches_reference(logits, [EACH[name]] * 3, histories)


def test_mixed_rows_in_one_batch_each_match_the_reference():
    params = list(EACH.values())
    logits = random_logits(len(params), seed=11)
    histories = [random_history(i, output_len=i % 5 * 4) for i in range(len(params))]
    assert_matches_reference(logits, params, histories)


def test_tiny_model_logits_match_the_reference():
    from tests.support.engine import tiny_model
    loaded = tiny_model()
    cfg = loaded.config
    prompts = [loaded.tokenizer.encode(text) for text in
               ("the cache", "radix trees share prefixes", "a b c a b c a b", "hello")]
    kv = KVCache(cfg.num_layers, 16, 16, cfg.num_kv_heads, cfg.head_dim)
    batch = build_forward_batch(prompts, [0] * 4, [[i] for i in range(4)], 16)
    logits = loaded.model.forward(batch, kv)[:, :VOCAB] * 20   # [4, VOCAB], sharpened
    assert logits.shape == (4, VOCAB) and torch.isfinite(logits).all()
    params = [ALL_ON, EACH["repetition"], EACH["greedy_penalised"], EACH["top_p"]]
    histories = [([t % VOCAB for t in prompt], [t % VOCAB for t in prompt[-3:]] * 2)
                 for prompt in prompts]
    assert_matches_reference(logits, params, histories)


def test_top_p_over_a_flat_row_beyond_the_cpu_candidates_matches_the_reference():
    """A nearly flat row needs more than TOP_P_CANDIDATES tokens for its mass: that row
    is sorted whole, its neighbour (peaked) is served from the candidates."""
    assert VOCAB > TOP_P_CANDIDATES
    logits = torch.stack([random_logits(1, seed=14, scale=0.01)[0], random_logits(1, seed=15)[0]])
    params = [SamplingParams(temperature=1.0, top_p=0.99, seed=1),
              SamplingParams(temperature=1.0, top_p=0.5, min_p=0.01, seed=2)]
    assert_matches_reference(logits, params, [([], []), ([], [])])
    assert int((token_distribution(logits, params)[0] > 0).sum()) > TOP_P_CANDIDATES


ROW_PARAMS = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.sampled_from([0, 1, 5, 50]),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
    min_p=st.sampled_from([0.0, 0.05, 0.5]),
    presence_penalty=st.sampled_from([0.0, -2.0, 0.7, 2.0]),
    frequency_penalty=st.sampled_from([0.0, -0.5, 1.1]),
    repetition_penalty=st.sampled_from([1.0, 0.7, 1.2, 3.0]),
    logit_bias=st.lists(st.tuples(st.integers(0, VOCAB - 1), st.sampled_from([-100.0, -3.0, 4.0])),
                        max_size=4, unique_by=lambda e: e[0]).map(tuple),
    min_tokens=st.sampled_from([0, 20]),
    ignore_eos=st.booleans(),
    stop_token_ids=st.sampled_from([(), (4, 5)]))


@settings(max_examples=60, deadline=None)
@given(params=st.lists(ROW_PARAMS, min_size=1, max_size=6), seed=st.integers(0, 1000))
def test_any_mix_of_values_matches_the_reference(params, seed):
    logits = random_logits(len(params), seed=seed)
    histories = [random_history(seed + i, output_len=(seed + i) % 30) for i in range(len(params))]
    assert_matches_reference(logits, params, histories)


# -- draws ---------------------------------------------------------------------------------

def test_seeded_draws_are_the_reference_draws_whatever_shares_the_batch():
    params = list(EACH.values())
    logits = random_logits(len(params), seed=12)
    histories = [random_history(i) for i in range(len(params))]
    counts = [TokenCounts(p + o, len(p)) for p, o in histories]
    tokens = sample_tokens(logits, params, [make_generator(p) for p in params], counts, EOS)
    for row, (p, (prompt, output)) in enumerate(zip(params, histories)):
        probs = reference_distribution(logits[row], p, prompt, output)
        if p.temperature < MIN_TEMPERATURE:
            assert tokens[row] == int(probs.argmax())
        else:
            assert tokens[row] == reference_draw(probs, make_generator(p)), p
        alone = sample_tokens(logits[row:row + 1], [p], [make_generator(p)],
                              [TokenCounts(prompt + output, len(prompt))], EOS)
        assert alone == [tokens[row]]


def test_counts_kept_across_steps_equal_counts_built_afresh():
    p = SamplingParams(temperature=1.0, seed=3, frequency_penalty=1.0, presence_penalty=0.5,
                       repetition_penalty=1.4)
    prompt = [1, 2, 3, 4]
    kept = TokenCounts(list(prompt), len(prompt))
    generator = make_generator(p)
    for step in range(12):
        logits = random_logits(1, seed=100 + step, scale=1.0)
        fresh = TokenCounts(list(kept.tokens), len(prompt))
        expected = token_distribution(logits, [p], [fresh])
        torch.testing.assert_close(token_distribution(logits, [p], [kept]), expected)
        kept.tokens.append(sample_tokens(logits, [p], [generator], [kept])[0])
    assert kept.num_output == 12 and kept.num_counted == 11   # the last one counts next step
    assert sum(kept.counts) == 11 and len(kept.ids) == len(set(kept.tokens[:-1]))


def test_min_tokens_never_draws_eos_or_a_stop_token_before_it():
    logits = torch.zeros(1, VOCAB)
    logits[0, list(EOS) + [4]] = 50.0                  # EOS and the stop token dominate
    p = SamplingParams(temperature=1.0, seed=1, min_tokens=3, stop_token_ids=(4,))
    history = TokenCounts([9, 9], 2)
    generator = make_generator(p)
    for _ in range(3):
        token = sample_tokens(logits, [p], [generator], [history], EOS)[0]
        assert token not in (*EOS, 4)
        history.tokens.append(token)
    assert sample_tokens(logits, [p], [generator], [history], EOS)[0] in (*EOS, 4)


def test_logit_bias_of_100_makes_the_token_certain():
    logits = random_logits(2, seed=13)
    params = [SamplingParams(temperature=1.0, seed=s, logit_bias=((17, 100.0),)) for s in (1, 2)]
    for _ in range(20):
        assert sample_tokens(logits, params, [make_generator(p) for p in params]) == [17, 17]


def test_validation_names_each_new_bad_value():
    def problem(**fields):
        return validate_sampling(SamplingParams(max_tokens=8, **fields), VOCAB)
    assert problem(presence_penalty=2.0, frequency_penalty=-2.0, repetition_penalty=3.0,
                   min_p=1.0, min_tokens=8, logit_bias=((VOCAB - 1, 100.0),)) is None
    assert "presence_penalty" in problem(presence_penalty=2.5)
    assert "frequency_penalty" in problem(frequency_penalty=float("nan"))
    assert "repetition_penalty" in problem(repetition_penalty=0.0)
    assert "min_p" in problem(min_p=1.5)
    assert "min_tokens" in problem(min_tokens=9)
    assert "vocabulary" in problem(logit_bias=((VOCAB, 1.0),))
    assert "logit_bias" in problem(logit_bias=((0, 101.0),))
