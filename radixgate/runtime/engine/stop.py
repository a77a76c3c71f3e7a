"""Stop strings over a growing text: find a match, hold back a possible match's start.

The matcher sees text in pieces (detokenized deltas). It returns the part that is safe to
emit: text that can no longer become part of a stop string. A stop string that spans
several tokens is found because the matcher's state carries over from piece to piece.

The stop strings are compiled once per request (lazily, on the first piece) into an
Aho-Corasick automaton, so the work per character does not grow with the number or the
length of the stop strings: each character costs one transition plus, amortized, at most
one failure-link step (``StopMatcher.steps`` counts both). The automaton state's depth is
the longest tail of the text that is a prefix of some stop string: exactly the text to
hold back. Building costs O(total stop length), bounded by ``MAX_STOP_STRINGS`` x
``MAX_STOP_LENGTH`` (``stop_problem`` names a request that exceeds them).
"""
from __future__ import annotations

import functools
from array import array
from dataclasses import dataclass

MAX_STOP_STRINGS = 64     # stop strings per request
MAX_STOP_LENGTH = 1000    # characters per stop string


def stop_problem(stops) -> str | None:
    """A message naming the limit a request's stop strings exceed, or None when within them."""
    if len(stops) > MAX_STOP_STRINGS:
        return (f"too many stop strings: {len(stops)} given, at most {MAX_STOP_STRINGS} "
                f"are allowed")
    longest = max((len(s) for s in stops if isinstance(s, str)), default=0)
    if longest > MAX_STOP_LENGTH:
        return (f"a stop string is too long: {longest} characters, at most "
                f"{MAX_STOP_LENGTH} are allowed")
    return None


@dataclass(frozen=True, slots=True)
class StopResult:
    emit: str                 # text safe to send now
    stop: str | None = None   # the stop string that matched (the text ends before it)


class StopAutomaton:
    """Aho-Corasick automaton over stop strings; immutable once built (shared by requests).

    Nodes are ints (0 is the root, the empty string). Each stop string's suffix beyond its
    longest prefix already in the trie becomes a run of consecutive nodes, so most nodes
    have one child, ``node + 1``, reached by ``label[node + 1]``; other children live in
    ``branches``. Per node: ``depth`` (length of its string), ``fail`` (the node of its
    longest proper suffix that is in the trie), and the longest stop string that is a suffix
    of its string (``match_length``, 0 for none, and ``match_index`` into ``stops``: the
    first listed of equal strings).
    """

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.parent = array("i", [0])
        self.depth = array("i", [0])
        self.branches: dict[int, dict[str, int]] = {0: {}}
        self.label: str | list[str] = ["\0"]   # label[v]: the character on the edge into v
        terminal: dict[int, int] = {}
        for index, stop in enumerate(stops):
            node = self._insert(stop)
            terminal.setdefault(node, index)
        self.label = "".join(self.label)
        self.fail = array("i", bytes(4 * len(self.depth)))
        self.match_length = array("i", bytes(4 * len(self.depth)))
        self.match_index = array("i", bytes(4 * len(self.depth)))
        self._link(terminal)

    @property
    def num_nodes(self) -> int:
        return len(self.depth)

    def child(self, node: int, char: str) -> int:
        """The node reached from ``node`` by ``char``, or -1 when the trie has no such edge."""
        following = node + 1
        if (following < len(self.parent) and self.parent[following] == node
                and self.label[following] == char):
            return following
        extra = self.branches.get(node)
        return -1 if extra is None else extra.get(char, -1)

    def _insert(self, stop: str) -> int:
        """Adds ``stop`` to the trie; returns the node of its last character."""
        node, position = 0, 0
        while position < len(stop):
            found = self.child(node, stop[position])
            if found < 0:
                break
            node, position = found, position + 1
        rest = stop[position:]
        if not rest:
            return node
        first = len(self.parent)
        if first != node + 1:   # node + 1 is some other node: this child is a branch
            self.branches.setdefault(node, {})[rest[0]] = first
        self.parent.append(node)
        self.parent.extend(range(first, first + len(rest) - 1))
        self.depth.extend(range(self.depth[node] + 1, self.depth[node] + 1 + len(rest)))
        self.label.extend(rest)
        return first + len(rest) - 1

    def _link(self, terminal: dict[int, int]) -> None:
        """Failure links and suffix matches, shallow nodes first (a node's fail is shallower)."""
        fail, match_length, match_index = self.fail, self.match_length, self.match_index
        for node in sorted(range(1, len(self.parent)), key=self.depth.__getitem__):
            parent, char = self.parent[node], self.label[node]
            if parent != 0:
                fallback = fail[parent]
                while (found := self.child(fallback, char)) < 0 and fallback != 0:
                    fallback = fail[fallback]
                fail[node] = max(found, 0)
            if node in terminal:
                match_length[node], match_index[node] = self.depth[node], terminal[node]
            else:
                match_length[node] = match_length[fail[node]]
                match_index[node] = match_index[fail[node]]


@functools.lru_cache(maxsize=16)
def compile_stops(stops: tuple[str, ...]) -> StopAutomaton:
    """The automaton for ``stops`` (cached: clients often repeat the same stop strings)."""
    return StopAutomaton(stops)


class StopMatcher:
    """Tracks unsent text and finds the earliest-starting stop string in it.

    ``feed`` returns the text safe to emit and, on a match, the text before the match that
    starts earliest (among equal starts, the stop string listed first); after a match every
    feed returns nothing. ``steps`` counts automaton transitions and failure-link steps.
    """

    def __init__(self, stops: tuple[str, ...] | list[str],
                 automaton: StopAutomaton | None = None):
        """``automaton``: ``compile_stops(stops)`` built beforehand (else on the first feed)."""
        self.stops = tuple(s for s in stops if s)
        self._automaton = automaton if automaton is not None and automaton.stops == self.stops \
            else None
        self._state = 0
        self._pending = ""   # text received but not yet emitted: the state's string
        self.stopped: str | None = None
        self.steps = 0

    def feed(self, text: str) -> StopResult:
        """Adds text; returns what may be emitted and, on a match, which stop string hit."""
        if self.stopped is not None:
            return StopResult("", self.stopped)
        pending = self._pending + text
        if not self.stops:
            self._pending = ""
            return StopResult(pending)
        found = self._scan(text, len(self._pending))
        if found is not None:
            start, index = found
            self._pending = ""
            self.stopped = self.stops[index]
            return StopResult(pending[:start], self.stopped)
        hold = self._automaton.depth[self._state]
        self._pending = pending[len(pending) - hold:] if hold else ""
        return StopResult(pending[:len(pending) - hold])

    def flush(self) -> str:
        """The held-back text, released when the request ends without a stop string."""
        pending, self._pending = self._pending, ""
        return "" if self.stopped is not None else pending

    def _scan(self, text: str, offset: int) -> tuple[int, int] | None:
        """Feeds ``text`` (which starts at ``offset`` in the pending text) to the automaton;
        returns (start in pending, stop index) of the earliest-starting match, or None."""
        if self._automaton is None:
            self._automaton = compile_stops(self.stops)
        automaton, state, steps = self._automaton, self._state, 0
        depth, fail = automaton.depth, automaton.fail
        match_length, match_index = automaton.match_length, automaton.match_index
        best: tuple[int, int] | None = None
        for position, char in enumerate(text, offset):
            while True:
                steps += 1
                following = automaton.child(state, char)
                if following >= 0 or state == 0:
                    break
                state = fail[state]
            state = max(following, 0)
            if match_length[state]:
                candidate = (position + 1 - match_length[state], match_index[state])
                if best is None or candidate < best:
                    best = candidate
            # a later match starts at or after the state's start: stop once past the best
            if best is not None and position + 1 - depth[state] > best[0]:
                break
        self._state, self.steps = state, self.steps + steps
        return best
