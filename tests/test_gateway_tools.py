"""Tool calls in model output: streamed and whole-text parsing agree, invalid calls stay text."""
from __future__ import annotations

import json

from radixgate.gateway.tools import ToolCallParser, split_output

NAMES = ("get_weather", "search")
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def kinds(items):
    """Comparable form; adjacent text pieces (one per streamed chunk) are merged."""
    out = []
    for k, v in items:
        if k == "text" and out and out[-1][0] == "text":
            out[-1] = ("text", out[-1][1] + v)
        else:
            out.append((k, v if k == "text" else (v.name, v.arguments)))
    return out


def test_text_then_call_splits_into_text_and_tool_call():
    items = split_output("Let me check.\n" + CALL, NAMES, "toolu_")
    assert kinds(items) == [("text", "Let me check.\n"), ("tool", ("get_weather", {"city": "Paris"}))]
    assert items[1][1].id.startswith("toolu_") and len(items[1][1].id) > 10


def test_streaming_in_tiny_chunks_gives_the_same_result_as_whole_text():
    text = "Sure. " + CALL + "\n" + CALL.replace("Paris", "Rome") + "\n"
    parser = ToolCallParser(NAMES, "call_")
    streamed = []
    for ch in text:
        streamed += parser.feed(ch)
    streamed += parser.finish()
    assert kinds(streamed) == kinds(split_output(text, NAMES, "call_"))
    assert kinds(streamed) == [("text", "Sure. "), ("tool", ("get_weather", {"city": "Paris"})),
                               ("tool", ("get_weather", {"city": "Rome"}))]


def test_partial_marker_is_held_back_until_decided():
    parser = ToolCallParser(NAMES, "x")
    assert parser.feed("abc <tool_") == [("text", "abc ")]
    assert parser.feed("thing>") == [("text", "<tool_thing>")]


def test_invalid_calls_and_stray_markers_never_reach_the_text():
    unknown = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    bad = '<tool_call>{"name": "search", "arguments": </tool_call>'
    for text in (unknown, bad, "</tool_call>"):
        assert split_output("a " + text + " b", NAMES, "x") == [("text", "a  b")], text
    assert split_output('a <tool_call>{"name": "search"', NAMES, "x") == [("text", "a ")]
    assert split_output("use <tool_call> tags", NAMES, "x") == [("text", "use  tags")]


def test_a_complete_call_without_its_closing_tag_still_counts():
    trailing = '<tool_call>{"name": "search", "arguments": {}} and more words'
    assert kinds(split_output(trailing, NAMES, "x")) == [("tool", ("search", {})),
                                                        ("text", " and more words")]


def test_arguments_as_json_string_or_input_key_are_accepted():
    a = split_output('<tool_call>{"name": "search", "arguments": "{\\"q\\": 1}"}</tool_call>', NAMES, "x")
    b = split_output('<tool_call>{"name": "search", "input": {"q": 1}}</tool_call>', NAMES, "x")
    assert a[0][1].arguments == b[0][1].arguments == {"q": 1}
    assert json.dumps(a[0][1].arguments) == '{"q": 1}'


def test_plain_text_without_tools_is_untouched_including_trailing_space():
    assert split_output("hello world \n", (), "x") == [("text", "hello world \n")]


def test_complete_call_missing_only_its_closing_tag_at_the_end_counts():
    items = split_output('ok <tool_call>{"name": "search", "arguments": {"q": "x"}}\n', NAMES, "x")
    assert kinds(items) == [("text", "ok "), ("tool", ("search", {"q": "x"}))]
