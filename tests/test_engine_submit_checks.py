"""The checks at submission read a ``SubmitView`` only: each is driven here by a hand-built
view, without a model, an engine core or a KV cache."""
from __future__ import annotations

import dataclasses

import pytest

from radixgate.runtime.engine.api import ErrorKind, Request, SamplingParams
from radixgate.runtime.engine.submit_checks import SubmitLimits, SubmitView, rejection

LIMITS = SubmitLimits(vocab_size=100, context_len=64, block_size=4, num_blocks=20, max_queue=3)


def view(**live) -> SubmitView:
    """A view of an idle engine with ``LIMITS``; ``live`` replaces any of its functions."""
    fields = dict(limits=LIMITS, draining=lambda: False, in_use=lambda rid: False,
                  pinned_blocks=lambda: 0, waiting=lambda: 0, waiting_of=lambda tenant: 0,
                  queue_quota=lambda tenant: None)
    fields.update(live)
    return SubmitView(**fields)


def ask(tokens=(1, 2, 3), max_tokens=4, **fields) -> Request:
    return Request(list(tokens), SamplingParams(max_tokens=max_tokens), **fields)


def kind(view_: SubmitView, request: Request) -> ErrorKind | None:
    problem = rejection(view_, request)
    return None if problem is None else problem[0]


def test_a_fitting_request_passes():
    assert rejection(view(), ask()) is None


def test_draining_refuses_first():
    problem = rejection(view(draining=lambda: True), ask(tokens=()))   # empty prompt too
    assert problem[0] is ErrorKind.OVERLOADED and "shutting down" in problem[1]


def test_a_live_request_id_is_refused():
    live = view(in_use=lambda rid: rid == "taken")
    assert kind(live, ask(request_id="taken")) is ErrorKind.BAD_REQUEST
    assert kind(live, ask(request_id="free")) is None


@pytest.mark.parametrize("tokens", [(), (0, 100), (-1, 5)])
def test_prompt_tokens_lie_in_the_vocabulary(tokens):
    problem = rejection(view(), ask(tokens=tokens))
    assert problem[0] is ErrorKind.BAD_REQUEST
    assert "empty" in problem[1] if not tokens else "[0, 100)" in problem[1]


def test_sampling_values_are_checked_against_the_vocabulary():
    bias = Request([1], SamplingParams(max_tokens=2, logit_bias=((100, 1.0),)))
    assert kind(view(), bias) is ErrorKind.BAD_REQUEST
    assert kind(view(), Request([1], SamplingParams(max_tokens=0))) is ErrorKind.BAD_REQUEST


def test_the_context_window_bounds_prompt_and_output():
    assert kind(view(), ask(tokens=range(60), max_tokens=4)) is None     # 16 blocks: fit
    problem = rejection(view(), ask(tokens=range(60), max_tokens=5))
    assert problem[0] is ErrorKind.TOO_LONG and "context window of 64" in problem[1]


def test_pinned_blocks_shrink_what_one_request_can_get():
    # 3 + 30 - 1 = 32 positions: 8 blocks of 4; 20 blocks minus 12 pinned still fit
    assert kind(view(pinned_blocks=lambda: 12), ask(max_tokens=30)) is None
    problem = rejection(view(pinned_blocks=lambda: 13), ask(max_tokens=30))
    assert problem[0] is ErrorKind.TOO_LONG and "needs 8 KV blocks of 4 tokens" in problem[1]


def test_the_live_state_is_read_only_when_its_check_is_reached():
    def never():
        raise AssertionError("read although an earlier check refused")
    early = view(pinned_blocks=never, waiting=never, waiting_of=never)
    assert kind(early, ask(tokens=range(70))) is ErrorKind.TOO_LONG


def test_a_full_queue_overloads():
    problem = rejection(view(waiting=lambda: 3), ask())
    assert problem[0] is ErrorKind.OVERLOADED and "(3 requests)" in problem[1]
    assert kind(view(waiting=lambda: 2), ask()) is None


def test_a_tenants_queue_quota():
    quota = view(queue_quota=lambda tenant: 1 if tenant == "small" else None,
                 waiting_of=lambda tenant: 1)
    problem = rejection(quota, ask(tenant="small"))
    assert problem[0] is ErrorKind.OVER_CAPACITY and "'small'" in problem[1]
    assert kind(quota, ask(tenant="big")) is None


def test_the_view_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        view().limits.vocab_size = 5
