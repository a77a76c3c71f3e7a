"""Rendering is linear in the conversation: a bounded number of template
renders, the same segments as rendering every message prefix (the old quadratic way, kept
here as the reference), and it stops early when the prompt outgrows its room or its
request is gone."""
from __future__ import annotations

import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixgate.gateway.render import (MAX_GLUE_SHAPES, ChatMessage, Conversation, Piece, PromptTooLong,
                                      RenderAbandoned, RenderBudget, TemplateError,
                                      render_prompt)

CHATML_WITH_DEFAULT_SYSTEM = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nDefault<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_LIKE = (
    "{{ bos }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
POSITIONAL = ("{% for message in messages %}[{{ loop.index }}]{{ message['content'] }}"
              "{% endfor %}")


class CharTokenizer:
    """One token per character (code point), so segments are easy to read in failures."""

    def __init__(self, template: str):
        self._template = jinja2.Environment().from_string(template)

    def encode(self, text: str) -> list[int]:
        return [ord(ch) for ch in text]

    encode_plain = encode

    def apply_chat_template(self, messages, add_generation_prompt=True):
        return self._template.render(messages=messages, bos="<s>",
                                     add_generation_prompt=add_generation_prompt)


def reference_message_texts(tokenizer, messages) -> list[tuple[str, str]]:
    """The quadratic reference: render the first k messages for every k."""
    sentinels = [{"role": m.role, "content": f"\ue000{i}\ue001"} for i, m in enumerate(messages)]
    out, previous = [], ""
    for k in range(1, len(messages) + 1):
        rendered = tokenizer.apply_chat_template(sentinels[:k], add_generation_prompt=False)
        own = rendered[len(previous):]
        pre, post = own.split(f"\ue000{k - 1}\ue001")
        out.append((pre, post))
        previous = rendered
    return out


def reference_segment_texts(tokenizer, conversation: Conversation) -> list[str]:
    texts = []
    messages = conversation.template_messages()
    for message, (pre, post) in zip(messages, reference_message_texts(tokenizer, messages)):
        pieces = message.pieces or (Piece(""),)
        for i, piece in enumerate(pieces):
            text = (pre if i == 0 else "\n") + piece.text
            texts.append(text + (post if i == len(pieces) - 1 else ""))
    return texts


def conversation_of(turns: list[tuple[str, list[str]]], system: list[str]) -> Conversation:
    return Conversation(tuple(Piece(t) for t in system),
                        tuple(ChatMessage(role, tuple(Piece(t) for t in texts))
                              for role, texts in turns))


def segment_texts(rendered) -> list[str]:
    ends = (0, *rendered.segment_ends)
    return ["".join(map(chr, rendered.tokens[a:b])) for a, b in zip(ends, ends[1:])]


texts = st.text(alphabet="abc <>|\n", max_size=6)
turns = st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]),
                           st.lists(texts, min_size=1, max_size=3)), min_size=1, max_size=12)


@pytest.mark.parametrize("template", [CHATML_WITH_DEFAULT_SYSTEM, LLAMA3_LIKE])
@settings(max_examples=60, deadline=None)
@given(turns=turns, system=st.lists(texts, max_size=2))
def test_segments_equal_the_render_every_prefix_reference(template, turns, system):
    tokenizer = CharTokenizer(template)
    conversation = conversation_of(turns, system)
    rendered = render_prompt(tokenizer, conversation)
    expected = reference_segment_texts(tokenizer, conversation)
    assert segment_texts(rendered)[:len(expected)] == expected


def test_three_thousand_messages_cost_a_handful_of_renders():
    tokenizer = CharTokenizer(CHATML_WITH_DEFAULT_SYSTEM)
    turns = [("user" if i % 2 == 0 else "assistant", [f"m{i}"]) for i in range(3001)]
    rendered = render_prompt(tokenizer, conversation_of(turns, []))
    assert rendered.template_renders <= 8       # was 3,002 + 2 (one per message prefix)
    assert segment_texts(rendered)[-2] == "<|im_start|>user\nm3000<|im_end|>\n"


def test_renders_do_not_grow_with_the_number_of_messages():
    tokenizer = CharTokenizer(LLAMA3_LIKE)
    counts = [render_prompt(tokenizer, conversation_of(
        [("user" if i % 2 == 0 else "assistant", ["x"]) for i in range(n)], ["sys"])
    ).template_renders for n in (30, 300, 3000)]
    assert counts[0] == counts[1] == counts[2] <= 8


def test_position_dependent_glue_is_learned_exactly_up_to_a_bound_then_refused():
    tokenizer = CharTokenizer(POSITIONAL)
    short = conversation_of([("user", ["a"])] * 20, [])
    assert segment_texts(render_prompt(tokenizer, short))[:20] == reference_segment_texts(
        tokenizer, short)
    with pytest.raises(TemplateError):
        render_prompt(tokenizer, conversation_of([("user", ["a"])] * (MAX_GLUE_SHAPES + 5), []))


def test_tokenizing_stops_once_the_prompt_outgrows_its_room():
    tokenizer = CharTokenizer(CHATML_WITH_DEFAULT_SYSTEM)
    conversation = conversation_of([("user", ["x" * 50])] * 10, [])
    with pytest.raises(PromptTooLong):
        render_prompt(tokenizer, conversation, RenderBudget(max_tokens=100))
    assert len(render_prompt(tokenizer, conversation, RenderBudget(max_tokens=10_000)).tokens) > 500


def test_an_abandoned_render_stops_between_segments():
    tokenizer = CharTokenizer(CHATML_WITH_DEFAULT_SYSTEM)
    polls = []

    def cancelled() -> bool:
        polls.append(1)
        return len(polls) > 3

    with pytest.raises(RenderAbandoned):
        render_prompt(tokenizer, conversation_of([("user", ["x"])] * 100, []),
                      RenderBudget(cancelled=cancelled))
    assert len(polls) == 4
