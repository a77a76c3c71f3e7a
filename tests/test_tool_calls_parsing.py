"""A call is read by its JSON structure, never by the first closing tag: every marker of the
prompt format inside a JSON string stays in the string, however the output is streamed
(radixgate/gateway/tools.py, ``ToolCallParser``)."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from radixgate.gateway.output import AnswerReader, read_answer
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.render import Conversation
from radixgate.gateway.tools import (CALL_CLOSE, CALL_OPEN, TOOLS_HEADER, ToolCallParser,
                                     forced_call_prefill, tool_call_text)

NAMES = ("lookup", "save")
MARKERS = [CALL_OPEN, CALL_CLOSE, "<tool_result", '<tool_result id="x">', "</tool_result>",
           ' error="true">', "<tool>", "</tool>", TOOLS_HEADER, '{"name": "lookup", ',
           '"arguments": {', "}}", "{", "}", "[", "]", '"', "\\", "\n", ", ", ": "]

strings = st.lists(st.one_of(st.sampled_from(MARKERS), st.text(max_size=4)),
                   max_size=6).map("".join)
values = st.recursive(st.one_of(strings, st.integers(), st.booleans(), st.none()),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(strings, inner, max_size=3)),
                      max_leaves=8)
arguments = st.dictionaries(strings, values, max_size=4)


def compact(name: str, args: dict) -> str:
    """A call as the forced-call grammar generates it."""
    body = json.dumps(args, ensure_ascii=False, separators=(", ", ": "))
    return f'{CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": {body}}}{CALL_CLOSE}'


def streamed(parser: ToolCallParser, text: str, cuts: list[int]) -> list:
    items, last = [], 0
    for cut in sorted(set(c % (len(text) + 1) for c in cuts)) + [len(text)]:
        items += parser.feed(text[last:cut])
        last = cut
    return items + parser.finish()


def calls_of(items: list) -> list:
    assert all(kind == "tool" for kind, _ in items), items
    return [(call.name, call.arguments) for _, call in items]


@settings(max_examples=300, deadline=None)
@given(calls=st.lists(st.tuples(st.sampled_from(NAMES), arguments), min_size=1, max_size=3),
       history_form=st.booleans(), cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_marker_laden_strings_round_trip_in_any_chunking(calls, history_form, cuts):
    render = (lambda n, a: tool_call_text("call_1", n, a)) if history_form else compact
    text = "\n".join(render(name, args) for name, args in calls)
    parser = ToolCallParser(NAMES, "call_")
    assert calls_of(streamed(parser, text, cuts)) == calls


@settings(max_examples=200, deadline=None)
@given(args=arguments, cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_a_forced_call_with_marker_laden_arguments_is_one_call(args, cuts):
    prefix = forced_call_prefill("lookup")
    converted = ConvertedPrompt(Conversation(), NAMES, prefix, max_tool_calls=1)
    rest = compact("lookup", args)[len(prefix):]
    whole = read_answer(converted, rest, "call_")
    assert calls_of(whole.items) == [("lookup", args)] and whole.ends_in_call
    reader = AnswerReader(converted, "call_")
    pieces, last = [], 0
    for cut in sorted(set(c % (len(rest) + 1) for c in cuts)) + [len(rest)]:
        pieces += reader.feed(rest[last:cut])
        last = cut
    assert calls_of(pieces + reader.finish()) == [("lookup", args)]


def test_the_closing_tag_inside_a_string_value_stays_in_the_string():
    """The issue's case: a value holding ``</tool_call>`` ended the parse early and the
    forced call came back as text."""
    args = {"name": "x</tool_call>y", "country": "<tool_call>{}"}
    parser = ToolCallParser(NAMES, "call_")
    assert calls_of(parser.feed(compact("lookup", args)) + parser.finish()) == [
        ("lookup", args)]


@settings(max_examples=200, deadline=None)
@given(args=arguments, cut=st.integers(min_value=0))
def test_an_output_cut_inside_a_call_leaves_no_markup_as_text(args, cut):
    text = compact("save", args)
    text = text[:cut % len(text)]
    answer = read_answer(ConvertedPrompt(Conversation(), NAMES), "Sure. " + text, "call_")
    assert "".join(v for k, v in answer.items if k == "text") == "Sure. "
    if answer.partial is not None:
        assert answer.partial.name == "save"
        assert text.endswith(answer.partial.arguments_text)
