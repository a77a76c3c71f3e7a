"""The model's answer as every API reads it: the text the gateway prefilled (a forced tool
call's opening, ``ConvertedPrompt.output_prefix``) comes first, and when the request has
tools their calls are cut out of the text (``tools.ToolCallParser``: docs/PROMPT_FORMAT.md).

Items are ``("text", str)`` or ``("tool", ToolCall)``, in output order; ``id_prefix`` is
the API's call id prefix (``toolu_``, ``call_``).
"""
from __future__ import annotations

from radixgate.gateway.prompt_parts import ConvertedPrompt
from radixgate.gateway.tools import ToolCallParser, split_output

Item = tuple[str, object]


def answer_items(converted: ConvertedPrompt, text: str, id_prefix: str) -> list[Item]:
    """A whole answer's items (no item for an empty text)."""
    text = converted.output_prefix + text
    if converted.tool_names:
        return split_output(text, converted.tool_names, id_prefix, converted.max_tool_calls)
    return [("text", text)] if text else []


class AnswerReader:
    """A streamed answer's items: ``feed(delta)`` gives those complete so far (text that
    may open a tool call is held back), ``finish()`` the rest at the end."""

    def __init__(self, converted: ConvertedPrompt, id_prefix: str):
        self._prefix = converted.output_prefix
        self._parser = (ToolCallParser(converted.tool_names, id_prefix,
                                       converted.max_tool_calls)
                        if converted.tool_names else None)

    def feed(self, text: str) -> list[Item]:
        if self._prefix:
            text, self._prefix = self._prefix + text, ""
        if self._parser is None:
            return [("text", text)] if text else []
        return self._parser.feed(text)

    def finish(self) -> list[Item]:
        items = self.feed("") if self._prefix else []
        return items + (self._parser.finish() if self._parser is not None else [])
