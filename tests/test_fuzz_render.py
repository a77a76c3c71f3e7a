"""Hypothesis on prompt rendering (radixgate/gateway/render.py) with the default model's tokenizer and
chat template: arbitrary unicode and odd message shapes never crash the renderer (a
``TemplateError`` is the one allowed refusal), and rendering ``messages[:k]`` yields a token
prefix, with the same breakpoints, of rendering all messages (docs/ARCHITECTURE.md section 2)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from radixgate.gateway.render import (ChatMessage, Conversation, Piece, RenderedPrompt,
                                      TemplateError, render_prompt)
from radixgate.runtime.model.loader import gguf_tokenizer
from radixgate.runtime.model.tokenizer import bytes_to_unicode

CI = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Valid unicode (no lone surrogates: JSON decoders of both APIs refuse those before rendering),
# biased towards template-relevant characters and the special-token spellings.
_ODD = st.sampled_from(["<|im_start|>", "<|im_end|>", "\n", "\r\n", "\x00", "\ue000", "\ue001",
                        "{{", "}}", "{%", "%}", "🙂", "e\u0301", "\u200d", " ", "\t"])
TEXT = st.lists(st.one_of(st.text(max_size=12), _ODD), max_size=6).map("".join)
TTL = st.sampled_from([None, None, 300.0, 3600.0])
PIECE = st.builds(Piece, TEXT, TTL)
PIECES = st.lists(PIECE, max_size=4).map(tuple)
MESSAGE = st.builds(ChatMessage, st.sampled_from(["user", "assistant", "system"]), PIECES)
CONVERSATION = st.builds(Conversation, system=PIECES,
                         messages=st.lists(MESSAGE, min_size=1, max_size=5).map(tuple))


@pytest.fixture(scope="module")
def tokenizer():
    return gguf_tokenizer("default")


@pytest.fixture(scope="module")
def unrepresentable_bytes(tokenizer) -> frozenset[int]:
    """Bytes with no byte-level token in the vocabulary (SmolLM2 lacks a few: \\x04, 0xF1,
    ...); the tokenizer drops them, so text containing them does not round-trip."""
    return frozenset(b for b, ch in bytes_to_unicode().items() if tokenizer.token_to_id(ch) is None)


def render_or_refuse(tokenizer, conversation: Conversation) -> RenderedPrompt | None:
    try:
        return render_prompt(tokenizer, conversation)
    except TemplateError:
        return None


def message_tokens(rendered: RenderedPrompt) -> list[int]:
    """Tokens up to the end of the last message (drops the generation prompt segment)."""
    return rendered.tokens[:rendered.segment_ends[-2]]


def check_rendering(tokenizer, lossy: frozenset[int], conversation: Conversation) -> None:
    rendered = render_or_refuse(tokenizer, conversation)
    if rendered is None:
        return
    assert all(0 <= t < tokenizer.vocab_size for t in rendered.tokens)
    assert list(rendered.segment_ends) == sorted(rendered.segment_ends)
    assert rendered.segment_ends[-1] == len(rendered.tokens)
    if not lossy.intersection(rendered.text.encode("utf-8")):
        assert tokenizer.decode(rendered.tokens) == rendered.text
    for bp in rendered.breakpoints:
        assert 0 < bp.offset <= len(rendered.tokens) and bp.offset in rendered.segment_ends
    for k in range(1, len(conversation.messages)):
        partial = Conversation(conversation.system, conversation.messages[:k])
        head = render_or_refuse(tokenizer, partial)
        assert head is not None, "a prefix of a renderable conversation must render"
        prefix = message_tokens(head)
        assert rendered.tokens[:len(prefix)] == prefix
        early = {b for b in head.breakpoints if b.offset <= len(prefix)}
        assert early <= set(rendered.breakpoints)


@CI
@given(conversation=CONVERSATION)
def test_rendering_never_crashes_and_prefixes_render_to_token_prefixes(
        tokenizer, unrepresentable_bytes, conversation):
    check_rendering(tokenizer, unrepresentable_bytes, conversation)


@pytest.mark.slow
@SLOW
@given(conversation=CONVERSATION)
def test_rendering_prefix_stability_long_run(tokenizer, unrepresentable_bytes, conversation):
    check_rendering(tokenizer, unrepresentable_bytes, conversation)


@CI
@given(text=TEXT, ttl=st.sampled_from([300.0, 3600.0]), tail_a=TEXT, tail_b=TEXT)
def test_breakpoint_prefix_tokens_do_not_depend_on_what_follows(tokenizer, text, ttl,
                                                                tail_a, tail_b):
    """Two messages that share a breakpointed first piece share its tokens and offset."""
    def conversation(tail: str) -> Conversation:
        return Conversation(messages=(ChatMessage("user", (Piece(text or "x", ttl),
                                                           Piece(tail))),))
    a, b = render_prompt(tokenizer, conversation(tail_a)), render_prompt(tokenizer,
                                                                       conversation(tail_b))
    assert a.breakpoints and a.breakpoints[0] == b.breakpoints[0]
    cut = a.breakpoints[0].offset
    assert a.tokens[:cut] == b.tokens[:cut]
