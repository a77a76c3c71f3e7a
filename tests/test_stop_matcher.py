"""StopMatcher (Aho-Corasick): same answers as a brute-force matcher, bounded work per char."""
from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from radixgate.runtime.engine.api import SamplingParams
from radixgate.runtime.engine.sampling import validate_sampling
from radixgate.runtime.engine.stop import (MAX_STOP_LENGTH, MAX_STOP_STRINGS, StopAutomaton,
                                    StopMatcher, StopResult, compile_stops, stop_problem)


class BruteForceStops:
    """The reference: search every stop in the whole pending text on every piece."""

    def __init__(self, stops):
        self.stops = tuple(s for s in stops if s)
        self.pending = ""
        self.stopped = None

    def feed(self, text: str) -> StopResult:
        if self.stopped is not None:
            return StopResult("", self.stopped)
        pending = self.pending + text
        matches = [(pending.find(s), i) for i, s in enumerate(self.stops) if s in pending]
        if matches:
            index, which = min(matches)
            self.pending, self.stopped = "", self.stops[which]
            return StopResult(pending[:index], self.stopped)
        hold = max((size for s in self.stops for size in range(1, min(len(s) - 1, len(pending)) + 1)
                    if pending.endswith(s[:size])), default=0)
        self.pending = pending[len(pending) - hold:]
        return StopResult(pending[:len(pending) - hold])

    def flush(self) -> str:
        pending, self.pending = self.pending, ""
        return "" if self.stopped is not None else pending


def run(matcher, pieces: list[str]) -> tuple[list[StopResult], str]:
    return [matcher.feed(piece) for piece in pieces], matcher.flush()


small_text = st.text(alphabet="abc", max_size=6)


@settings(max_examples=400, deadline=None)
@given(stops=st.lists(small_text, max_size=6), pieces=st.lists(small_text, max_size=10))
def test_matches_the_brute_force_reference_on_random_pieces(stops, pieces):
    assert run(StopMatcher(stops), pieces) == run(BruteForceStops(stops), pieces)


@settings(max_examples=100, deadline=None)
@given(stops=st.lists(st.text(alphabet="ab\u00e9\U0001f600", min_size=1, max_size=12),
                      min_size=1, max_size=8),
       text=st.text(alphabet="ab\u00e9\U0001f600", max_size=60), seed=st.integers(0, 2**16))
def test_matches_the_reference_whatever_the_piece_boundaries(stops, text, seed):
    rng, pieces, position = random.Random(seed), [], 0
    while position < len(text):
        size = rng.randint(0, 4)
        pieces.append(text[position:position + size])
        position += size
    assert run(StopMatcher(stops), pieces) == run(BruteForceStops(stops), pieces)


def test_earliest_start_wins_over_earlier_end():
    result = StopMatcher(["b", "abc"]).feed("xabc")
    assert (result.emit, result.stop) == ("x", "abc")


def test_equal_starts_pick_the_stop_listed_first():
    assert StopMatcher(["abc", "ab"]).feed("abc").stop == "abc"
    assert StopMatcher(["ab", "abc"]).feed("abc").stop == "ab"
    assert StopMatcher(["ab", "ab"]).feed("ab").stop == "ab"


def test_a_stop_that_is_a_prefix_of_another_holds_back_the_longer_one():
    matcher = StopMatcher(["zzzX", "zz"])
    assert matcher.feed("az").emit == "a"
    assert matcher.feed("z") == StopResult("", "zz")


def test_long_near_misses_cost_steps_linear_in_the_text():
    """64 stops of 1,000 characters that the text keeps almost matching: the work per
    character stays a small constant, not the 64 x 1,000 a slice-per-stop search costs."""
    stops = ["x" * (MAX_STOP_LENGTH - 1) + chr(0x4E00 + i) for i in range(MAX_STOP_STRINGS)]
    matcher = StopMatcher(stops)
    emitted = "".join(matcher.feed("x").emit for _ in range(3000))
    assert matcher.steps <= 2 * 3000
    assert emitted == "x" * (3000 - (MAX_STOP_LENGTH - 1))   # the rest is held back
    assert matcher.feed(chr(0x4E01)) == StopResult("", stops[1])


def test_random_stops_over_a_small_alphabet_cost_at_most_two_steps_per_character():
    rng = random.Random(7)
    stops = ["".join(rng.choice("ab") for _ in range(MAX_STOP_LENGTH))
             for _ in range(MAX_STOP_STRINGS)]
    matcher = StopMatcher(stops)
    for _ in range(1000):
        matcher.feed("".join(rng.choice("ab") for _ in range(3)))
    assert matcher.stopped is None and matcher.steps <= 2 * 3000


def test_the_automaton_has_one_node_per_distinct_prefix():
    assert StopAutomaton(("abc", "abd", "b")).num_nodes == 1 + 4 + 1   # root, a ab abc abd, b


def test_stop_problem_names_the_limits():
    assert stop_problem(["a"] * MAX_STOP_STRINGS) is None
    assert stop_problem(["a" * MAX_STOP_LENGTH]) is None
    assert str(MAX_STOP_STRINGS) in stop_problem(["a"] * (MAX_STOP_STRINGS + 1))
    assert str(MAX_STOP_LENGTH) in stop_problem(["a" * (MAX_STOP_LENGTH + 1)])


def test_validate_sampling_refuses_stops_over_the_limits():
    too_many = SamplingParams(max_tokens=4, stop=tuple(["s"] * (MAX_STOP_STRINGS + 1)))
    too_long = SamplingParams(max_tokens=4, stop=("s" * (MAX_STOP_LENGTH + 1),))
    assert "stop strings" in validate_sampling(too_many, 100)
    assert "too long" in validate_sampling(too_long, 100)
    assert validate_sampling(SamplingParams(max_tokens=4, stop=("s",)), 100) is None


def test_a_prebuilt_automaton_is_used_and_a_mismatched_one_ignored():
    stops = ("alpha", "beta")
    built = compile_stops(stops)
    matcher = StopMatcher(stops, built)
    assert matcher.feed("xx alpha yy").stop == "alpha"
    assert matcher._automaton is built
    other = StopMatcher(("gamma",), built)          # built for other strings: not used
    assert other.feed("a gamma").stop == "gamma"
    assert other._automaton is not built


async def test_the_gateway_compiles_stop_strings_off_the_engine_thread():
    from types import SimpleNamespace

    from radixgate.gateway.service import engine_request, sampling_params
    state = SimpleNamespace(config=SimpleNamespace(server=SimpleNamespace(request_timeout_s=9)))
    principal = SimpleNamespace(tenant="acme", limits=SimpleNamespace(use_public_prefixes=False))
    body = SimpleNamespace(temperature=0)              # a parsed body's sampling fields
    sampling = sampling_params(body, max_tokens=4, stop=["END", "STOP"])
    request = await engine_request(state, principal, "req_1", [1, 2], (), sampling)
    assert request.stop_automaton is not None and request.stop_automaton.stops == ("END", "STOP")
    too_many = sampling_params(body, max_tokens=4, stop=[f"s{i}" for i in range(65)])
    refused = await engine_request(state, principal, "req_2", [1, 2], (), too_many)
    assert refused.stop_automaton is None            # the engine refuses it (400): no work here
