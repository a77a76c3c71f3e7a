"""Prompt rendering: conversation -> token ids + breakpoint offsets (docs/ARCHITECTURE.md
section 2, step 3).

Both APIs convert their request into a ``Conversation``: a system part (tool definitions
first, then system text), then messages, each a list of ``Piece``s (one per content block).
A piece may carry a cache breakpoint TTL. ``render_prompt`` renders it with the model's own
chat template and tokenizes it **in segments** so that a prefix's token ids never depend on
what follows it:

- the template is applied to the message list with each message's content replaced by a
  sentinel; the text between two sentinels is the glue after one message and before the
  next, cut where rendering the messages up to the first of them ends (learned once per
  boundary shape, so a conversation costs a bounded number of renders, never one per
  message); the template must grow by appending only;
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

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from radixgate.runtime.engine.api import Breakpoint

PIECE_SEPARATOR = "\n"
_SENTINEL = "\ue000{}\ue001"      # private-use characters never produced by the APIs' JSON
_SENTINEL_PATTERN = re.compile("\ue000(\\d+)\ue001")
MAX_GLUE_SHAPES = 32               # distinct message-boundary shapes one render may learn


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
    template_renders: int = 0                           # chat-template applications it cost


class TemplateError(ValueError):
    """The chat template rejected the conversation (e.g. roles it does not allow)."""


class RenderAbandoned(Exception):
    """The request that asked for this render was aborted or timed out: work stopped."""


class PromptTooLong(ValueError):
    """The prompt has more than ``limit`` tokens; tokenizing stopped there."""

    def __init__(self, limit: int):
        super().__init__(f"the prompt is longer than {limit} tokens")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class RenderBudget:
    """Bounds on one render: ``max_tokens`` (stop and raise ``PromptTooLong`` past it),
    ``cancelled`` (polled between segments: true raises ``RenderAbandoned``) and
    ``on_template_render`` (called at each chat-template application, failed renders too)."""

    max_tokens: int | None = None
    cancelled: Callable[[], bool] | None = None
    on_template_render: Callable[[], None] | None = None


def render_prompt(tokenizer: ChatTokenizer, conversation: Conversation,
                  budget: RenderBudget = RenderBudget()) -> RenderedPrompt:
    """Render and tokenize segment-wise; see the module docstring for the cut rules.
    Linear in the prompt: a bounded number of template renders whatever the message count
    (``RenderedPrompt.template_renders``)."""
    messages = conversation.template_messages()
    if conversation.system and not accepts_system_role(tokenizer):
        messages = fold_system(messages)
    counter = _RenderCounter(tokenizer, budget.on_template_render)
    segments: list[Segment] = []
    message_texts, without = _message_texts(counter, messages)
    for message, (pre, post) in zip(messages, message_texts):
        segments.extend(_message_segments(message.pieces, pre, post))
    segments.extend(_reply_segments(counter, messages, without, conversation.prefill))
    rendered = _tokenize(tokenizer, segments, budget)
    return dataclasses.replace(rendered, template_renders=counter.renders)


_SYSTEM_ROLE: dict[str, bool] = {}      # chat template text -> whether it takes a system turn


def accepts_system_role(tokenizer: ChatTokenizer) -> bool:
    """Whether the chat template renders a system message (Gemma 2's and early Mistral
    templates raise on one), probed once per template."""
    key = getattr(tokenizer, "chat_template", None) or ""
    if key not in _SYSTEM_ROLE:
        try:
            _apply(tokenizer, [{"role": "system", "content": "s"},
                               {"role": "user", "content": "u"}], add_generation_prompt=False)
            _SYSTEM_ROLE[key] = True
        except TemplateError:
            _SYSTEM_ROLE[key] = False
    return _SYSTEM_ROLE[key]


def fold_system(messages: list[ChatMessage]) -> list[ChatMessage]:
    """For a template without a system role: the system pieces open the first user message,
    a blank line before its own text (as Gemma 3's template folds them); breakpoints stay on
    their pieces."""
    system, rest = messages[0], messages[1:]
    if not rest or rest[0].role != "user":
        return [ChatMessage("user", system.pieces), *rest]
    *head, last = system.pieces
    pieces = (*head, Piece(last.text + PIECE_SEPARATOR, last.ttl_s), *rest[0].pieces)
    return [ChatMessage("user", pieces), *rest[1:]]


def render_continuation(tokenizer: ChatTokenizer, base: list[int], roles: Sequence[str],
                        conversation: Conversation,
                        budget: RenderBudget = RenderBudget()) -> RenderedPrompt:
    """An earlier turn's exact ids ``base`` (its prompt and answer, as generated) + the end
    of that assistant message + ``conversation``'s new messages + the generation prompt
    (+ prefill), cut as ``render_prompt`` cuts, so the earlier turn's KV is reused exactly.
    ``roles``: the earlier turn's template roles (the glue is learned from them, the answer
    and the new messages). ``budget.max_tokens`` bounds the whole prompt."""
    new = list(conversation.messages)
    if roles and roles[0] == "system" and not accepts_system_role(tokenizer):
        roles = roles[1:]                    # the first turn folded its system text (fold_system)
    history = [ChatMessage(role, ()) for role in roles] + [ChatMessage("assistant", ())] + new
    counter = _RenderCounter(tokenizer, budget.on_template_render)
    texts, without = _message_texts(counter, history)
    segments = [Segment(((texts[len(roles)][1], True),), None)]     # the answer's end
    for message, (pre, post) in zip(new, texts[len(roles) + 1:]):
        segments.extend(_message_segments(message.pieces, pre, post))
    segments.extend(_reply_segments(counter, history, without, conversation.prefill))
    room = None if budget.max_tokens is None else budget.max_tokens - len(base)
    rendered = _tokenize(tokenizer, segments, dataclasses.replace(budget, max_tokens=room))
    return RenderedPrompt(base + rendered.tokens, (), rendered.text,
                          tuple(len(base) + end for end in rendered.segment_ends),
                          counter.renders)


def _reply_segments(counter: "_RenderCounter", messages: Sequence[ChatMessage], without: str,
                    prefill: Sequence[Piece]) -> list[Segment]:
    """The generation prompt, followed by the prefill's pieces when there is one."""
    generation = _generation_prompt(counter, messages, without)
    if prefill:
        return _piece_segments(prefill, sep="", pre=generation)
    return [Segment(((generation, True),), None)]


class _RenderCounter:
    """Applies the chat template and counts how often (the work a request caused)."""

    def __init__(self, tokenizer: ChatTokenizer, on_render: Callable[[], None] | None = None):
        self.tokenizer = tokenizer
        self.renders = 0
        self._on_render = on_render

    def apply(self, messages: list[dict], add_generation_prompt: bool) -> str:
        self.renders += 1
        if self._on_render is not None:
            self._on_render()
        return _apply(self.tokenizer, messages, add_generation_prompt)


def _sentinel_messages(messages: Sequence[ChatMessage]) -> list[dict]:
    return [{"role": m.role, "content": _SENTINEL.format(i)} for i, m in enumerate(messages)]


def _message_texts(counter: _RenderCounter, messages: Sequence[ChatMessage]
                   ) -> tuple[list[tuple[str, str]], str]:
    """(text before content, text after content) of each message as the template renders
    it, and the whole rendering without the generation prompt.

    The template is applied once to all messages; the glue between two contents is
    ``post`` of the first plus ``pre`` of the second. Where that glue is cut is learned by
    rendering the messages up to the first one (a prefix render: its end is the cut) once
    per distinct (previous role, role, glue text) shape; every prefix render must be a
    prefix of the whole (an incremental template). A template whose glue varies with the
    position (say, a message number) gives a new shape per boundary and is learned exactly,
    up to ``MAX_GLUE_SHAPES``. So a conversation costs two full renders plus a few short
    ones, not one per message."""
    if not messages:
        return [], ""
    sentinels = _sentinel_messages(messages)
    whole = counter.apply(sentinels, add_generation_prompt=False)
    starts, ends = _sentinel_spans(whole, len(messages))
    cuts: dict[tuple[str, str, str], int] = {}
    out_pre = [whole[:starts[0]]]
    out_post: list[str] = []
    for k in range(1, len(messages)):
        glue = whole[ends[k - 1]:starts[k]]
        shape = (messages[k - 1].role, messages[k].role, glue)
        if shape not in cuts:
            cuts[shape] = _cut_after(counter, sentinels, k, whole, ends[k - 1])
            if len(cuts) > MAX_GLUE_SHAPES:
                raise TemplateError("chat template renders too many distinct kinds of "
                                    "message boundaries")
        out_post.append(glue[:cuts[shape]])
        out_pre.append(glue[cuts[shape]:])
    out_post.append(whole[ends[-1]:])
    return list(zip(out_pre, out_post)), whole


def _sentinel_spans(whole: str, n: int) -> tuple[list[int], list[int]]:
    """Start and end offset of each message's sentinel; each must appear once, in order
    (one scan of the text)."""
    found = list(_SENTINEL_PATTERN.finditer(whole))
    numbers = [int(match.group(1)) for match in found]
    if numbers != list(range(n)):
        missing = next((i for i, number in enumerate(numbers + [-1]) if number != i), n)
        raise TemplateError(f"chat template did not render message {missing} exactly once")
    return [match.start() for match in found], [match.end() for match in found]


def _cut_after(counter: _RenderCounter, sentinels: list[dict], k: int, whole: str,
               content_end: int) -> int:
    """Length of message k-1's post text: the first k messages rendered alone end there."""
    prefix = counter.apply(sentinels[:k], add_generation_prompt=False)
    if not whole.startswith(prefix) or len(prefix) < content_end:
        raise TemplateError("chat template is not incremental: rendering one more message "
                            "changed the text of earlier ones")
    return len(prefix) - content_end


def _generation_prompt(counter: _RenderCounter, messages: Sequence[ChatMessage],
                       without: str) -> str:
    with_prompt = counter.apply(_sentinel_messages(messages), add_generation_prompt=True)
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


def _tokenize(tokenizer: ChatTokenizer, segments: list[Segment],
              budget: RenderBudget = RenderBudget()) -> RenderedPrompt:
    tokens: list[int] = []
    ends: list[int] = []
    ttl_at: dict[int, float] = {}
    glue_tokens: dict[str, list[int]] = {}     # the template's text repeats: encode it once
    for segment in segments:
        if budget.cancelled is not None and budget.cancelled():
            raise RenderAbandoned()
        for text, trusted in segment.parts:
            if not text:
                continue
            if trusted:
                if text not in glue_tokens:
                    glue_tokens[text] = tokenizer.encode(text)
                tokens.extend(glue_tokens[text])
            else:
                tokens.extend(tokenizer.encode_plain(text))
        if budget.max_tokens is not None and len(tokens) > budget.max_tokens:
            raise PromptTooLong(budget.max_tokens)
        ends.append(len(tokens))
        if segment.ttl is not None and len(tokens) > 0:
            ttl_at[len(tokens)] = max(segment.ttl, ttl_at.get(len(tokens), 0.0))
    breakpoints = tuple(Breakpoint(offset, ttl) for offset, ttl in sorted(ttl_at.items()))
    return RenderedPrompt(tokens, breakpoints, "".join(s.text for s in segments), tuple(ends))


def join_pieces(pieces: Sequence[Piece]) -> str:
    """The text the pieces render to inside one message (for previews and count checks)."""
    return PIECE_SEPARATOR.join(p.text for p in pieces)
