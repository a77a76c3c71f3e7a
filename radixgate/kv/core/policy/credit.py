"""The credit policy: LRU with two credits and a penalty, partly filled last blocks first.

Credits are in LRU ticks (a request makes about two: its match and its insert); the
parameters are ``config.CreditParams``:

- ``continuation_ticks``: after ``RadixTree.expect_continuation`` (the cached response ends
  in a tool call, so the client will come back with the tool's result appended), the path
  counts as accessed that many ticks in the future, until the next match through it
  consumes the credit. Agent loops whose tool is still running outlive finished ones; the
  credit runs out by itself if the client never comes back.
- ``branch_ticks``: per distinct continuation beyond the first that requests created below
  a node (``branches``; one evicted and cached again counts once), up to ``branch_cap`` of
  them, the node counts as accessed that many ticks later. A document or system prompt that
  several different questions extended outlives an equally recent prefix that only one
  conversation used; a chain of turns (one branch per node) gets nothing, so conversations
  keep plain LRU order. The cap keeps a prefix that stopped being used from holding memory
  for long.
- ``probation_ticks``: new content below a prefix with ``probation_branches`` or more
  continuations that mostly never came back (questions under a document, one-off documents
  in a long tail) counts as that many ticks older until a match touches it
  (``probation.py``): it goes before the documents those questions were about.
- ``partial_tails_first``: before any whole block is evicted, leaves give back their partly
  filled last block (LRU order among them). Such a block costs a whole block of memory for
  fewer than ``B`` tokens, all of which only the leaf's exact continuation can reuse, so it
  is the cheapest memory to give back; a hash-block cache never holds it at all. Without
  this, that cache beat token-exact matching at some budgets (the memory it saved outweighed
  the partial tokens we reuse); with it, at 1 of 560 seed-points of the sweep, by 0.11
  points.

The defaults come from the memory sweep over five seeds, checked on five other seeds
(benchmarks/RESULTS.md): they raise the agent and document workloads' hit rates at nearly
every budget and cost multi-turn chat 0.2-0.8 points.

Queues: the LRU heap of ``LRUPolicy`` by this key, plus a heap of leaves whose last block
is partly filled (``in_partials``); a popped partial entry whose key grew is pushed again,
one that no longer qualifies is dropped.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..node import first_token
from .lru import LRUPolicy, LRUState
from .probation import Sightings, sighting_key

if TYPE_CHECKING:
    from ..config import CreditParams
    from ..node import TreeNode

MAX_BRANCHES = 256            # distinct continuations counted per node


class CreditState(LRUState):
    __slots__ = ("expected_access", "branches", "branch_tokens", "in_partials", "probation",
                 "child_reuses", "passes")

    def __init__(self, last_access: int):
        super().__init__(last_access)
        self.expected_access = 0    # tick by which a continuation is expected (0: none)
        self.branches = 0           # distinct continuations ever created below it
        self.branch_tokens: set[int] | None = None   # their first tokens (up to MAX_BRANCHES)
        self.in_partials = False    # has an entry in the partial-tail heap
        self.probation = False      # new content nobody has matched yet (probation.py)
        self.child_reuses = 0       # continuations that came back (probation.py)
        self.passes = 0             # matches that went through all of it

    def record_branch(self, token: int) -> None:
        """A child starting with ``token`` was created below this node. Counts distinct
        first tokens only, so a continuation that is evicted and cached again is not a new
        branch; saturates at ``MAX_BRANCHES``."""
        tokens = self.branch_tokens
        if tokens is None:
            tokens = self.branch_tokens = set()
        if token not in tokens and len(tokens) < MAX_BRANCHES:
            tokens.add(token)
            self.branches = min(self.branches + 1, MAX_BRANCHES)


class CreditPolicy(LRUPolicy):
    """``key``: the last access (or the expected one), plus the branch credit, less the
    probation penalty; the smallest goes first."""

    State = CreditState

    def __init__(self, params: CreditParams):
        super().__init__()
        self.params = params
        self.sightings = Sightings()        # contents inserted as new leaves
        self.partials: list[tuple[float, int, TreeNode]] = []

    def key(self, node: TreeNode) -> float:
        state, params = node.policy_state, self.params
        key = max(state.last_access, state.expected_access)
        if state.branches > 1:
            key += params.branch_ticks * min(state.branches - 1, params.branch_cap)
        if state.probation and self.on_probation(node):
            key -= params.probation_ticks
        return key

    def on_probation(self, node: TreeNode) -> bool:
        """Whether ``node``'s key takes the probation penalty now (its parent's
        continuations still mostly do not come back)."""
        parent = node.parent
        if not node.policy_state.probation or parent is None or parent.policy_state is None:
            return False
        state = parent.policy_state
        return (state.child_reuses < state.branches
                and state.branches >= self.params.probation_branches)

    # ---- the tree's notifications ---------------------------------------------------

    def on_insert(self, parent: TreeNode, leaf: TreeNode, data: bytes) -> None:
        leaf.policy_state = CreditState(self.tick)
        if parent.parent is not None:
            parent.policy_state.record_branch(first_token(leaf.key))
            self._admit(parent, leaf, data)
        self.offer(leaf)

    def _admit(self, parent: TreeNode, leaf: TreeNode, data: bytes) -> None:
        """Put ``leaf`` on probation if it is new content below a parent with many
        continuations, or count the parent's continuation as come back if this content was
        seen before (probation.py)."""
        params, state = self.params, parent.policy_state
        if not params.probation_ticks or state.branches < params.probation_branches:
            return
        if self.sightings.record(sighting_key(leaf.ns.name, data, leaf.start)) > 1:
            state.child_reuses += 1
        else:
            leaf.policy_state.probation = True

    def on_hit(self, parent: TreeNode, node: TreeNode, whole: bool) -> None:
        state = node.policy_state
        state.last_access = self.tick
        state.probation = False
        if whole:
            state.expected_access = 0       # the expected continuation (if any) came
            state.passes += 1
            if node.end - node.start >= self.block_size and parent.policy_state is not None:
                parent.policy_state.child_reuses += 1    # a whole continuation came back

    def on_split(self, upper: TreeNode, lower: TreeNode) -> None:
        below = lower.policy_state
        state = upper.policy_state = CreditState(below.last_access)
        state.expected_access = below.expected_access
        state.child_reuses = below.passes   # its one continuation so far came back that often
        state.record_branch(first_token(lower.key))

    def on_trim(self, node: TreeNode, first_dropped_token: int) -> None:
        """The node lost its tail, so every continuation created below its old end now
        starts with that token: re-caching one of them is not a new branch (the count is
        kept)."""
        state = node.policy_state
        if state.branch_tokens is not None:
            state.branch_tokens = {first_dropped_token}

    def expect(self, path: Iterable[TreeNode]) -> None:
        until = self.tick + self.params.continuation_ticks
        for node in path:
            state = node.policy_state
            state.expected_access = max(state.expected_access, until)

    # ---- the queues -----------------------------------------------------------------

    def offer(self, node: TreeNode) -> None:
        super().offer(node)
        state = node.policy_state
        if not state.in_partials and self._has_partial_tail(node):
            state.in_partials = True
            heapq.heappush(self.partials, (self.key(node), next(self.seq), node))

    def _has_partial_tail(self, node: TreeNode) -> bool:
        """An evictable-looking leaf whose last block is partly filled and can come off
        (a leaf always keeps its first block)."""
        return (self.params.partial_tails_first and node.end % self.block_size != 0
                and len(node.blocks) > 1 and not node.children and node.lock_ref == 0)

    def pop_partial_tail(self) -> TreeNode | None:
        """The unlocked, unpinned leaf with a partly filled last block and the smallest key,
        or None when there is none."""
        partials = self.partials
        while partials:
            key, _, node = heapq.heappop(partials)
            state = node.policy_state
            state.in_partials = False
            if not node.alive or not self._has_partial_tail(node):
                continue
            if node.pin is not None:
                continue        # expired: goes whole, as a ttl eviction; else once expired
            current = self.key(node)
            if current > key:               # touched since it was queued
                state.in_partials = True
                heapq.heappush(partials, (current, next(self.seq), node))
                continue
            return node
        return None

    def compact(self) -> None:
        super().compact()
        for entry in self.partials:
            if not entry[2].alive:
                entry[2].policy_state.in_partials = False
        self.partials = [entry for entry in self.partials if entry[2].alive]
        heapq.heapify(self.partials)

    def size(self) -> int:
        return len(self.heap) + len(self.partials)
