"""``Sequence`` holds one request's state, with its output, its ``record_logits`` record,
its grammar state and its drafter in objects of their own; it is built by keyword."""
from __future__ import annotations

import pytest
import torch

from radixgate.runtime.engine.api import Request
from radixgate.runtime.engine.sequence import LogitsRecord, OutputState, Sequence
from radixgate.runtime.engine.trace import RequestTrace


def test_built_by_keyword_beyond_the_request():
    with pytest.raises(TypeError):
        Sequence(Request([1, 2]), None, 1, None, None, None)      # the old positional form
    seq = Sequence(Request([1, 2]), arrival=7)
    assert seq.arrival == 7 and seq.sink is None and seq.generator is None
    assert seq.tokens == [1, 2] and seq.num_prompt == 2


def test_a_bare_sequence_gets_its_own_output_and_no_record():
    first, second = Sequence(Request([1]), arrival=1), Sequence(Request([1]), arrival=2)
    assert isinstance(first.output, OutputState) and first.output is not second.output
    first.output.text_parts.append("a")
    assert second.output.text_parts == [] and second.output.prompt_logprobs == [None]
    assert first.logits is None and first.drafter is None


def test_the_grammar_state_is_the_requests_own():
    grammar = object()                                 # a RequestGrammar stand-in
    assert Sequence(Request([1], grammar=grammar), arrival=1).grammar is grammar
    assert Sequence(Request([1]), arrival=1).grammar is None


def test_the_parts_are_slotted():
    """Plain attribute access on the per-token path: no instance dict."""
    for part in (OutputState(), LogitsRecord()):
        assert not hasattr(part, "__dict__")


def test_the_logits_record_becomes_the_requests_trace():
    record = LogitsRecord()
    row = torch.tensor([1.0, 0.5])
    record.gaps.append(0.5)
    record.rows.append(row)
    seq = Sequence(Request([1]), arrival=1, logits=record)
    trace = seq.logits.trace()
    assert isinstance(trace, RequestTrace) and trace.gaps == (0.5,) and trace.logits[0] is row
