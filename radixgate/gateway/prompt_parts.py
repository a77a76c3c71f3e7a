"""Pieces both API converters share: tool sections, breakpoint rules, the converted prompt.

Breakpoint rules (Anthropic's, applied to both APIs, in cache order tools -> system ->
messages): at most ``MAX_BREAKPOINTS``; none on an empty text block; a 1h breakpoint may not
come after a 5m one. Violations raise ``ApiError(BAD_REQUEST)`` with Anthropic's wording.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from radixgate.gateway.errors import ApiError, Kind
from radixgate.gateway.render import Conversation, Piece
from radixgate.gateway.constraints import Constraint
from radixgate.gateway.tools import TOOLS_HEADER, ToolSpec, tool_definition_text

MAX_BREAKPOINTS = 4
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


@dataclass(frozen=True, slots=True)
class ConvertedPrompt:
    """A request's conversation plus how to read the model's output.

    ``tool_names``: tools whose calls in the output become tool_use blocks / tool_calls
    (empty: no parsing). ``output_prefix``: text the gateway prefilled for a forced tool
    choice; it is part of the model's answer and parsed with it. ``constraint``: the
    grammar the output must match (radixgate/gateway/constraints.py; None: free). ``max_tool_calls``:
    calls after this many are dropped (parallel calls disabled: 1; None: no limit).
    """

    conversation: Conversation
    tool_names: tuple[str, ...] = ()
    output_prefix: str = ""
    constraint: Constraint | None = None
    max_tool_calls: int | None = None


@dataclass
class BreakpointRules:
    """Collects breakpoints in cache order and enforces the rules as they arrive."""

    ttls: list[str] = field(default_factory=list)

    def add(self, ttl: str, text: str, where: str) -> float:
        """Validate one breakpoint on a block whose rendered text is ``text``; its TTL in s."""
        if not text:
            raise ApiError(Kind.BAD_REQUEST,
                           f"{where}: cache_control cannot be set for empty text blocks",
                           param=where)
        if ttl == "1h" and "5m" in self.ttls:
            raise ApiError(Kind.BAD_REQUEST,
                           "a ttl='1h' cache_control block must not come after a ttl='5m' "
                           "cache_control block. Note that blocks are processed in the "
                           "following order: `tools`, `system`, `messages`.", param=where)
        self.ttls.append(ttl)
        if len(self.ttls) > MAX_BREAKPOINTS:
            raise ApiError(Kind.BAD_REQUEST,
                           f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be "
                           f"provided. Found {len(self.ttls)}.", param=where)
        return TTL_SECONDS[ttl]


def tool_pieces(tools: list[tuple[ToolSpec, str | None]], rules: BreakpointRules
                ) -> list[Piece]:
    """The tools section of the system part: header, then one piece per tool definition.

    ``tools`` pairs each spec with its cache_control TTL name (or None)."""
    if not tools:
        return []
    pieces = [Piece(TOOLS_HEADER)]
    for i, (spec, ttl) in enumerate(tools):
        text = tool_definition_text(spec)
        ttl_s = rules.add(ttl, text, f"tools.{i}") if ttl else None
        pieces.append(Piece(text, ttl_s))
    return pieces


def check_unique_tool_names(names: list[str], where: str = "tools") -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ApiError(Kind.BAD_REQUEST, f"{where}: tool names must be unique ({name!r})",
                           param=where)
        seen.add(name)
