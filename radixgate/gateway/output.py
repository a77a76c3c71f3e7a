"""The model's answer as every API reads it: the text the gateway prefilled (a forced tool
call's opening, ``ConvertedPrompt.output_prefix``) comes first, and when the request has
tools their calls are cut out of the text (``tools.ToolCallParser``: docs/PROMPT_FORMAT.md).

Items are ``("text", str)`` or ``("tool", ToolCall)``, in output order; ``id_prefix`` is
the API's call id prefix (``toolu_``, ``call_``). A call the output stopped inside is no
item: it is the answer's ``partial`` (OpenAI chat reports it when ``max_tokens`` cut it).

An answer is cut (``cut_short``) when it stopped for ``max_tokens`` anywhere but right after
a finished call: OpenAI's ``length``, Anthropic's ``max_tokens``, an incomplete response,
even when calls finished before the cut.
"""
from __future__ import annotations

from dataclasses import dataclass

from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.tools import PartialCall, ToolCallParser, split_output
from radixgate.runtime.engine.api import Finished, FinishReason

Item = tuple[str, object]


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole answer: its items and the call it stopped inside, if any."""

    items: list[Item]
    partial: PartialCall | None = None

    @property
    def ends_in_call(self) -> bool:
        """The last item is a finished call (whitespace after calls is no item)."""
        return self.partial is None and bool(self.items) and self.items[-1][0] == "tool"


def read_answer(converted: ConvertedPrompt, text: str, id_prefix: str) -> Answer:
    """A whole answer (no item for an empty text)."""
    text = converted.output_prefix + text
    if not converted.tool_names:
        return Answer([("text", text)] if text else [])
    items = split_output(text, converted.tool_names, id_prefix, converted.max_tool_calls)
    partial = next((v for k, v in items if k == "partial"), None)
    return Answer([item for item in items if item[0] != "partial"], partial)


def answer_items(converted: ConvertedPrompt, text: str, id_prefix: str) -> list[Item]:
    """A whole answer's items (no item for an empty text)."""
    return read_answer(converted, text, id_prefix).items


def cut_short(finished: Finished, ends_in_call: bool) -> bool:
    """``max_tokens`` stopped the answer before it ended (not right after a finished call:
    a grammar completed by the last allowed token also reports the length)."""
    return finished.reason is FinishReason.LENGTH and not ends_in_call


class AnswerReader:
    """A streamed answer's items: ``feed(delta)`` gives those complete so far (text that
    may open a tool call is held back), ``finish()`` the rest at the end; then ``partial``
    is the call the answer stopped inside, if any, and ``ends_in_call`` tells whether its
    last item is a finished call."""

    def __init__(self, converted: ConvertedPrompt, id_prefix: str):
        self._prefix = converted.output_prefix
        self._parser = (ToolCallParser(converted.tool_names, id_prefix,
                                       converted.max_tool_calls)
                        if converted.tool_names else None)
        self.partial: PartialCall | None = None
        self._last_kind = ""

    @property
    def ends_in_call(self) -> bool:
        return self.partial is None and self._last_kind == "tool"

    def feed(self, text: str) -> list[Item]:
        if self._prefix:
            text, self._prefix = self._prefix + text, ""
        if self._parser is None:
            return self._seen([("text", text)] if text else [])
        return self._seen(self._parser.feed(text))

    def finish(self) -> list[Item]:
        items = self.feed("") if self._prefix else []
        return items + self._seen(self._parser.finish() if self._parser is not None else [])

    def _seen(self, items: list[Item]) -> list[Item]:
        out = []
        for kind, value in items:
            if kind == "partial":
                self.partial = value
            elif kind == "tool" or value:
                out.append((kind, value))
                self._last_kind = kind
        return out
