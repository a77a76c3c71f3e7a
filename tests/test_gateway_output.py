"""radixgate/gateway/output.py: the one reader of an answer's text and tool calls that every API's
body and stream use. Streamed in any pieces, an answer gives the items the whole answer
gives; the prefilled opening of a forced call is part of it."""
from __future__ import annotations

from radixgate.gateway.output import AnswerReader, answer_items
from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.render import Conversation
from radixgate.gateway.tools import forced_call_prefill

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def streamed(converted: ConvertedPrompt, pieces: list[str]) -> list:
    reader = AnswerReader(converted, "call_")
    items = [item for piece in pieces for item in reader.feed(piece)]
    return items + reader.finish()


def merged(items: list) -> list:
    """Adjacent text items joined, tool calls as (name, arguments): ids are random."""
    out: list = []
    for kind, value in items:
        if kind == "text" and out and out[-1][0] == "text":
            out[-1] = ("text", out[-1][1] + value)
        elif kind == "text":
            out.append(("text", value)) if value else None
        else:
            out.append(("tool", value.name, value.arguments))
    return out


def test_a_streamed_answer_gives_the_whole_answers_items_at_every_cut():
    converted = ConvertedPrompt(Conversation(), tool_names=("get_weather",))
    text = "Sure. " + CALL + "\n" + CALL
    whole = merged(answer_items(converted, text, "call_"))
    assert whole == [("text", "Sure. "), ("tool", "get_weather", {"city": "Paris"}),
                     ("tool", "get_weather", {"city": "Paris"})]
    for cut in range(len(text) + 1):
        assert merged(streamed(converted, [text[:cut], text[cut:]])) == whole, cut


def test_the_prefilled_opening_of_a_forced_call_is_read_with_the_answer():
    prefix = forced_call_prefill("get_weather")
    converted = ConvertedPrompt(Conversation(), ("get_weather",), prefix)
    rest = CALL[len(prefix):]
    expected = [("tool", "get_weather", {"city": "Paris"})]
    assert merged(answer_items(converted, rest, "call_")) == expected
    assert merged(streamed(converted, [rest[:5], rest[5:]])) == expected


def test_without_tools_the_answer_is_its_text():
    converted = ConvertedPrompt(Conversation())
    assert answer_items(converted, "", "call_") == []
    assert merged(streamed(converted, ["a ", CALL])) == [("text", "a " + CALL)]
