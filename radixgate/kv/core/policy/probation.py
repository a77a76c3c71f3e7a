"""Probation for content seen for the first time below a prefix whose continuations do not
come back (``CreditPolicy``, ``CreditParams.probation_ticks``).

A document many different questions extended, or a system prompt under many one-shot user
turns, has children that are each used once: the question. Every such child (and every
document seen for the first time in a long tail of documents) takes memory that a popular
document would use again. A child starts on *probation* when

- its parent already has ``probation_branches`` distinct continuations,
- the parent's continuations rarely came back: fewer reuses than branches (a reuse is a
  match through a whole child of a block or more, or new content whose start was seen
  below the parent before, i.e. a continuation that was evicted and asked for again), and
- this content was not seen before (``Sightings``: a hash of the prompt up to a little past
  the branch point, so a re-asked document is recognised wherever the tree split it).

A probationary leaf counts as ``probation_ticks`` older. A match that touches it ends its
probation; a conversation's turns (each continuation comes back) never start one.
"""

from __future__ import annotations

from itertools import islice

from ..node import TOKEN_BYTES

SIGHTING_ANCHOR = 64            # tokens: the hashed prefix ends on this grid, 1-2 steps past the branch
MAX_SIGHTINGS = 1 << 16         # remembered contents; the oldest half goes when full


class Sightings:
    """How often each content (a hashed prompt prefix) was inserted as a new leaf: a
    bounded, insertion-ordered counter."""

    def __init__(self, capacity: int = MAX_SIGHTINGS):
        self.capacity = capacity
        self._seen: dict[int, int] = {}

    def record(self, key: int) -> int:
        """Count one more sighting of ``key``; returns the count including this one."""
        seen = self._seen
        count = seen.get(key, 0) + 1
        seen[key] = count
        if len(seen) > self.capacity:
            for old in list(islice(seen, len(seen) // 2)):
                del seen[old]
        return count

    def __len__(self) -> int:
        return len(self._seen)


def sighting_key(namespace: str, data: bytes, branch_at: int) -> int:
    """Hash of the packed prompt ``data`` up to the grid point 1-2 anchors past token
    ``branch_at`` (or its end)."""
    anchor = (branch_at // SIGHTING_ANCHOR + 2) * SIGHTING_ANCHOR
    return hash((namespace, data[:anchor * TOKEN_BYTES]))
