"""Sampling: greedy, temperature, top-k, top-p, per-request seeds, parameter validation."""
import torch

from radixgate.runtime.engine.api import SamplingParams
from radixgate.runtime.engine.sampling import make_generator, sample_tokens, top2_gaps, validate_sampling

VOCAB = 1000


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def _draw(logits_row: torch.Tensor, params: SamplingParams, n: int) -> list[int]:
    gen = make_generator(params)
    return [sample_tokens(logits_row[None], [params], [gen])[0] for _ in range(n)]


def test_greedy_picks_each_rows_argmax():
    logits = _logits(5)
    params = [SamplingParams(temperature=0.0)] * 5
    assert sample_tokens(logits, params, [None] * 5) == logits.argmax(-1).tolist()


def test_mixed_batch_keeps_greedy_rows_greedy():
    logits = _logits(4, seed=1)
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=3)] * 2
    gens = [make_generator(p) for p in params]
    tokens = sample_tokens(logits, params, gens)
    assert tokens[0] == int(logits[0].argmax()) and tokens[2] == int(logits[2].argmax())


def test_same_seed_reproduces_the_same_tokens():
    row = _logits(1, seed=2)[0]
    params = SamplingParams(temperature=1.5, seed=1234)
    assert _draw(row, params, 30) == _draw(row, params, 30)


def test_different_seeds_draw_different_tokens():
    row = torch.zeros(VOCAB)   # uniform: two seeds agreeing 30 times is impossible in practice
    first = _draw(row, SamplingParams(temperature=1.0, seed=1), 30)
    second = _draw(row, SamplingParams(temperature=1.0, seed=2), 30)
    assert first != second


def test_seeded_row_is_unaffected_by_other_rows_in_the_batch():
    logits = _logits(3, seed=4)
    params = SamplingParams(temperature=1.0, seed=99)
    alone = sample_tokens(logits[1:2], [params], [make_generator(params)])
    others = [SamplingParams(temperature=1.0, seed=s) for s in (5, 6)]
    batch = sample_tokens(logits, [others[0], params, others[1]],
                          [make_generator(others[0]), make_generator(params), make_generator(others[1])])
    assert batch[1] == alone[0]


def test_top_k_draws_only_from_the_k_best():
    row = _logits(1, seed=5)[0]
    best = set(torch.topk(row, 5).indices.tolist())
    draws = _draw(row, SamplingParams(temperature=2.0, top_k=5, seed=7), 200)
    assert set(draws) <= best and len(set(draws)) > 1


def test_top_k_one_is_greedy():
    row = _logits(1, seed=6)[0]
    assert set(_draw(row, SamplingParams(temperature=3.0, top_k=1, seed=8), 20)) == {int(row.argmax())}


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    row = torch.full((VOCAB,), -30.0)
    row[[10, 20, 30]] = torch.tensor([3.0, 2.0, 1.0])   # probs ~ .665 .245 .090
    draws = _draw(row, SamplingParams(temperature=1.0, top_p=0.8, seed=9), 300)
    assert set(draws) == {10, 20}


def test_low_temperature_concentrates_on_the_best_token():
    row = _logits(1, seed=10)[0]
    draws = _draw(row, SamplingParams(temperature=0.01, seed=11), 50)
    assert draws.count(int(row.argmax())) == 50


def test_top2_gap_is_best_minus_second():
    logits = torch.tensor([[1.0, 5.0, 4.5], [0.0, 0.0, -1.0]])
    assert top2_gaps(logits) == [0.5, 0.0]


def test_validation_names_the_bad_value():
    assert validate_sampling(SamplingParams(), VOCAB) is None
    assert "temperature" in validate_sampling(SamplingParams(temperature=-1), VOCAB)
    assert "top_p" in validate_sampling(SamplingParams(top_p=0.0), VOCAB)
    assert "top_k" in validate_sampling(SamplingParams(top_k=-2), VOCAB)
    assert "max_tokens" in validate_sampling(SamplingParams(max_tokens=0), VOCAB)
    assert "stop" in validate_sampling(SamplingParams(stop=("",)), VOCAB)
    assert "stop_token_ids" in validate_sampling(SamplingParams(stop_token_ids=(VOCAB,)), VOCAB)
