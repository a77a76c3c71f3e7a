"""Stop strings over a growing text: find a match, hold back a possible match's start.

The matcher sees text in pieces (detokenized deltas). It returns the part that is safe to
emit: text that can no longer become part of a stop string. A stop string that spans
several tokens is found because the held-back tail is searched again with the next piece.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopResult:
    emit: str                 # text safe to send now
    stop: str | None = None   # the stop string that matched (the text ends before it)


class StopMatcher:
    """Tracks unsent text and finds the earliest stop string in it."""

    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = tuple(s for s in stops if s)
        self._pending = ""   # text received but not yet emitted
        self.stopped: str | None = None

    def feed(self, text: str) -> StopResult:
        """Adds text; returns what may be emitted and, on a match, which stop string hit."""
        if self.stopped is not None:
            return StopResult("", self.stopped)
        pending = self._pending + text
        if not self.stops:
            self._pending = ""
            return StopResult(pending)
        found = self._earliest_match(pending)
        if found is not None:
            index, stop = found
            self._pending = ""
            self.stopped = stop
            return StopResult(pending[:index], stop)
        hold = self._held_back_length(pending)
        self._pending = pending[len(pending) - hold:] if hold else ""
        return StopResult(pending[:len(pending) - hold])

    def flush(self) -> str:
        """The held-back text, released when the request ends without a stop string."""
        pending, self._pending = self._pending, ""
        return "" if self.stopped is not None else pending

    def _earliest_match(self, text: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self.stops:
            index = text.find(stop)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _held_back_length(self, text: str) -> int:
        """Length of the longest tail of text that is a proper prefix of some stop string."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest
