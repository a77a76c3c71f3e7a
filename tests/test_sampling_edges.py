"""Sampling edge values: temperatures so small that dividing by them overflows,
and logits rows holding inf or NaN, give a valid token per row and never raise, so one
request's numbers cannot fail the batch it shares."""
import pytest
import torch

from radixgate.runtime.engine.api import SamplingParams
from radixgate.runtime.engine.sampling import (MIN_TEMPERATURE, is_greedy, make_generator,
                                        sample_tokens)

VOCAB = 500
INF, NAN = float("inf"), float("nan")
TINY_TEMPERATURES = [1e-39, 1e-320, 5e-324, MIN_TEMPERATURE / 2]


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 10


def _sample(logits: torch.Tensor, params: SamplingParams) -> list[int]:
    n = logits.shape[0]
    return sample_tokens(logits, [params] * n, [make_generator(params) for _ in range(n)])


def _valid(tokens: list[int]) -> bool:
    return all(isinstance(t, int) and 0 <= t < VOCAB for t in tokens)


@pytest.mark.parametrize("temperature", TINY_TEMPERATURES)
def test_temperature_below_the_floor_is_greedy(temperature):
    logits = _logits(6, seed=1)
    params = SamplingParams(temperature=temperature, top_p=0.9, top_k=20)
    assert is_greedy(params) and make_generator(params) is None
    assert _sample(logits, params) == logits.argmax(-1).tolist()


@pytest.mark.parametrize("temperature", TINY_TEMPERATURES)
def test_tiny_temperature_row_leaves_its_batch_neighbours_sampling(temperature):
    logits = _logits(3, seed=2)
    params = [SamplingParams(temperature=1.0, seed=7), SamplingParams(temperature=temperature),
              SamplingParams(temperature=0.7, seed=8, top_p=0.5)]
    tokens = sample_tokens(logits, params, [make_generator(p) for p in params])
    assert _valid(tokens) and tokens[1] == int(logits[1].argmax())
    alone = sample_tokens(logits[[0]], params[:1], [make_generator(params[0])])
    assert tokens[0] == alone[0]           # a seeded row draws the same whatever shares it


def test_temperature_at_the_floor_samples_without_overflow():
    logits = _logits(4, seed=3) * 1e4        # huge logits / 1e-5 overflow without the shift
    params = SamplingParams(temperature=MIN_TEMPERATURE, seed=1)
    assert not is_greedy(params)
    assert _sample(logits, params) == logits.argmax(-1).tolist()   # that sharp: the argmax


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0),
                                    SamplingParams(temperature=1e-39),
                                    SamplingParams(temperature=1.0, seed=3),
                                    SamplingParams(temperature=1.0, seed=3, top_k=5, top_p=0.8),
                                    SamplingParams(temperature=INF, seed=3)])
def test_rows_with_nan_and_inf_logits_give_valid_tokens(params):
    logits = _logits(5, seed=4)
    logits[0, 10] = NAN                      # one NaN: never picked
    logits[1, :] = NAN                       # all NaN: no finite value
    logits[2, :] = -INF                      # all -inf
    logits[3, 42] = INF                      # a +inf wins
    logits[4, ::2] = NAN                     # half NaN: drawn from the finite half
    tokens = _sample(logits, params)
    assert _valid(tokens)
    assert tokens[0] != 10 and tokens[1] == 0 and tokens[2] == 0 and tokens[3] == 42
    assert tokens[4] % 2 == 1


def test_nan_logits_count_as_minus_infinity_for_greedy_rows():
    logits = _logits(2, seed=5)
    best = int(logits[0].argmax())
    logits[0, (best + 1) % VOCAB] = NAN
    logits[1, :] = -INF
    logits[1, 7] = NAN
    assert _sample(logits, SamplingParams(temperature=0.0)) == [best, 0]


def test_row_with_one_finite_value_among_minus_infinity_picks_it():
    logits = torch.full((1, VOCAB), -INF)
    logits[0, 123] = 5.0
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=2.0, seed=1),
                   SamplingParams(temperature=INF, seed=1, top_k=3)):
        assert _sample(logits, params) == [123]
