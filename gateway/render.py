"""Prompt rendering: conversation -> token ids + breakpoint offsets (DESIGN.md sections 2, 7).

Both APIs convert their request into a ``Conversation``: a system part (tool definitions
first, then system text), then messages, each a list of ``Piece``s (one per content block).
A piece may carry a cache breakpoint TTL. ``render_prompt`` renders it with the model's own
chat template and tokenizes it **in segments** so that a prefix's token ids never depend on
what follows it:

- the template is applied to the message list with each message's content replaced by a
  sentinel; rendering the first k messages for k = 1..n gives each message's own text (the
  template's glue before and after its content), which must grow by appending only;
- every message is tokenized on its own, and inside a message every piece starts a new
  segment (``pre + piece0``, ``"\\n" + piece1``, ..., ``"\\n" + piece_last + post``);
- a breakpoint on a piece sits at the end of that piece's segment; on a message's last
  piece it therefore covers the template's end-of-message text too;
- inside a segment the template's own text is tokenized with special tokens parsed and the
  client's content with ``encode_plain``, so text spelling ``<|im_end|>`` stays text and can
  never forge a turn.

The cut points are a function of the block structure only (never of where breakpoints
are), so a request without breakpoints hits what a request with them cached.
Formats are documented in docs/PROMPT_FORMAT.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from radixgate.runtime.api import Breakpoint

PIECE_SEPARATOR = "\n"
_SENTINEL = "\ue000{}\ue001"      # private-use characters never produced by the APIs' JSON


class ChatTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...          # parses special-token strings
    def encode_plain(self, text: str) -> list[int]: ...    # never makes control tokens
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True
                            ) -> str: ...


@dataclass(frozen=True, slots=True)
class Piece:
    """One content block as text; ``ttl_s`` set = a cache breakpoint at its end."""

    text: str
    ttl_s: float | None = None


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str                      # a chat-template role: system, user, assistant
    pieces: tuple[Piece, ...]


@dataclass(frozen=True, slots=True)
class Conversation:
    """What both APIs render. ``prefill`` continues the assistant turn (Anthropic prefill,
    forced tool choice); it is part of the prompt and is echoed before the model's output."""

    system: tuple[Piece, ...] = ()
    messages: tuple[ChatMessage, ...] = ()
    prefill: tuple[Piece, ...] = ()

    def template_messages(self) -> list[ChatMessage]:
        if not self.system:
            return list(self.messages)
        return [ChatMessage("system", self.system), *self.messages]


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    tokens: list[int]
    breakpoints: tuple[Breakpoint, ...]
    text: str
    segment_ends: tuple[int, ...] = field(default=())   # token offset after each segment


class TemplateError(ValueError):
    """The chat template rejected the conversation (e.g. roles it does not allow)."""


def render_prompt(tokenizer: ChatTokenizer, conversation: Conversation) -> RenderedPrompt:
    """Render and tokenize segment-wise; see the module docstring for the cut rules."""
    messages = conversation.template_messages()
    segments: list[Segment] = []
    message_texts = _message_texts(tokenizer, messages)
    for message, (pre, post) in zip(messages, message_texts):
        segments.extend(_message_segments(message.pieces, pre, post))
    generation = _generation_prompt(tokenizer, messages, message_texts)
    prefill = conversation.prefill
    if prefill:
        segments.extend(_piece_segments(prefill, sep="", pre=generation))
    else:
        segments.append(Segment(((generation, True),), None))
    return _tokenize(tokenizer, segments)


def _message_texts(tokenizer: ChatTokenizer, messages: Sequence[ChatMessage]
                   ) -> list[tuple[str, str]]:
    """(text before content, text after content) of each message as the template renders it."""
    sentinel_messages = [{"role": m.role, "content": _SENTINEL.format(i)}
                         for i, m in enumerate(messages)]
    out: list[tuple[str, str]] = []
    previous = ""
    for k in range(1, len(messages) + 1):
        rendered = _apply(tokenizer, sentinel_messages[:k], add_generation_prompt=False)
        if not rendered.startswith(previous):
            raise TemplateError("chat template is not incremental: rendering one more message "
                                "changed the text of earlier ones")
        own = rendered[len(previous):]
        sentinel = _SENTINEL.format(k - 1)
        if own.count(sentinel) != 1:
            raise TemplateError(f"chat template did not render message {k - 1} exactly once")
        pre, post = own.split(sentinel)
        out.append((pre, post))
        previous = rendered
    return out


def _generation_prompt(tokenizer: ChatTokenizer, messages: Sequence[ChatMessage],
                       message_texts: list[tuple[str, str]]) -> str:
    sentinel_messages = [{"role": m.role, "content": _SENTINEL.format(i)}
                         for i, m in enumerate(messages)]
    without = _apply(tokenizer, sentinel_messages, add_generation_prompt=False) if messages else ""
    with_prompt = _apply(tokenizer, sentinel_messages, add_generation_prompt=True)
    if not with_prompt.startswith(without):
        raise TemplateError("chat template's generation prompt rewrites earlier text")
    return with_prompt[len(without):]


def _apply(tokenizer: ChatTokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    except TemplateError:
        raise
    except Exception as e:  # jinja2 raise_exception(...) and friends
        raise TemplateError(f"chat template rejected the conversation: {e}") from e


@dataclass(frozen=True, slots=True)
class Segment:
    """One tokenization unit: ``parts`` are (text, trusted) — trusted text is the template's
    own and may contain special tokens; ``ttl`` set = a breakpoint at the segment's end."""

    parts: tuple[tuple[str, bool], ...]
    ttl: float | None

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.parts)


def _message_segments(pieces: Sequence[Piece], pre: str, post: str) -> list[Segment]:
    segments = _piece_segments(pieces or (Piece(""),), sep=PIECE_SEPARATOR, pre=pre)
    last = segments[-1]
    segments[-1] = Segment((*last.parts, (post, True)), last.ttl)
    return segments


def _piece_segments(pieces: Sequence[Piece], sep: str, pre: str = "") -> list[Segment]:
    """One segment per piece; the first starts with the trusted ``pre``, the others with
    ``sep`` (our own separator, trusted too)."""
    return [Segment(((pre if i == 0 else sep, True), (p.text, False)), p.ttl_s)
            for i, p in enumerate(pieces)]


def _tokenize(tokenizer: ChatTokenizer, segments: list[Segment]) -> RenderedPrompt:
    tokens: list[int] = []
    ends: list[int] = []
    ttl_at: dict[int, float] = {}
    for segment in segments:
        for text, trusted in segment.parts:
            if text:
                tokens.extend(tokenizer.encode(text) if trusted else tokenizer.encode_plain(text))
        ends.append(len(tokens))
        if segment.ttl is not None and len(tokens) > 0:
            ttl_at[len(tokens)] = max(segment.ttl, ttl_at.get(len(tokens), 0.0))
    breakpoints = tuple(Breakpoint(offset, ttl) for offset, ttl in sorted(ttl_at.items()))
    return RenderedPrompt(tokens, breakpoints, "".join(s.text for s in segments), tuple(ends))


def join_pieces(pieces: Sequence[Piece]) -> str:
    """The text the pieces render to inside one message (for previews and count checks)."""
    return PIECE_SEPARATOR.join(p.text for p in pieces)
