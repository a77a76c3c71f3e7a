"""Offline Belady-style baseline for the memory sweep: its own small radix tree + an oracle.

The simulator mirrors the real cache's memory model (docs/ARCHITECTURE.md section 3) so that block
counts are comparable with ``RadixTree``: token-exact radix nodes; a node covering
positions ``[s, e)`` holds one physical block per block index ``s // B .. (e - 1) // B``;
a split shares the boundary block between parent and child; a request that reuses a
prefix ending inside a block copies that block (copy-on-write), so a branch created there
holds a block of its own, and a node extended there swaps its partial block for the
request's copy when it holds it alone. Memory = distinct blocks held by nodes.

Eviction is Belady's rule on leaves: evict the leaf whose next use (the first future
request that would reuse at least one of its tokens) is furthest away. The future is known
through ``FutureOracle``, a compressed trie of every request of the trace that records,
per trie node, the sorted indices of the requests passing through it.
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field
from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int], start: int, stop: int) -> int:
    """Length of the common prefix of a[start:stop] and b[start:stop]."""
    stop = min(stop, len(a), len(b))
    if a[start:stop] == b[start:stop]:
        return stop - start
    i = start
    while a[i] == b[i]:
        i += 1
    return i - start


@dataclass(eq=False)
class _TrieNode:
    start: int
    end: int
    first: int = -1                                   # request whose tokens spell the edge
    reqs: list[int] = field(default_factory=list)     # sorted request indices through the edge
    children: dict[int, "_TrieNode"] = field(default_factory=dict)


class FutureOracle:
    """Which requests of the trace pass through a given prefix, per namespace."""

    def __init__(self, trace: Sequence[tuple[str, Sequence[int]]]):
        self.tokens = [list(tokens) for _, tokens in trace]
        self.roots: dict[str, _TrieNode] = {}
        for index, (namespace, _) in enumerate(trace):
            self._add(self.roots.setdefault(namespace, _TrieNode(0, 0)), index)
        self.paths = [self._path(self.roots[ns], i) for i, (ns, _) in enumerate(trace)]

    def _add(self, root: _TrieNode, index: int) -> None:
        """Insert request ``index``, splitting edges so the request ends on a node boundary."""
        tokens, node, depth = self.tokens[index], root, 0
        while depth < len(tokens):
            child = node.children.get(tokens[depth])
            if child is None:
                node.children[tokens[depth]] = _TrieNode(depth, len(tokens), index, [index])
                return
            cut = depth + common_prefix(tokens, self.tokens[child.first], depth, child.end)
            if cut < child.end:
                child = self._split(node, child, cut)
            child.reqs.append(index)
            node, depth = child, cut

    def _split(self, parent: _TrieNode, child: _TrieNode, cut: int) -> _TrieNode:
        upper = _TrieNode(child.start, cut, child.first, list(child.reqs))
        parent.children[self.tokens[child.first][child.start]] = upper
        child.start = cut
        upper.children[self.tokens[child.first][cut]] = child
        return upper

    def _path(self, root: _TrieNode, index: int) -> tuple[list[int], list[_TrieNode]]:
        tokens, node, ends, nodes = self.tokens[index], root, [], []
        while node.end < len(tokens):
            node = node.children[tokens[node.end]]
            ends.append(node.end)
            nodes.append(node)
        return ends, nodes

    def _through(self, request: int, position: int) -> list[int]:
        ends, nodes = self.paths[request]
        return nodes[bisect.bisect_left(ends, position)].reqs

    def popularity(self, request: int, position: int) -> int:
        """How many requests of the whole trace share ``tokens[request][:position]``."""
        return len(self._through(request, position))

    def later_requests(self, request: int, position: int, now: int) -> list[int]:
        """Requests after ``now`` whose prompt shares ``tokens[request][:position]``."""
        reqs = self._through(request, position)
        return reqs[bisect.bisect_right(reqs, now):]

    def next_use(self, request: int, position: int, now: int) -> float:
        """First request after ``now`` whose prompt shares ``tokens[request][:position]``
        (``position >= 1``); ``inf`` when none does."""
        reqs = self._through(request, position)
        j = bisect.bisect_right(reqs, now)
        return reqs[j] if j < len(reqs) else math.inf


@dataclass(eq=False)
class _Node:
    start: int
    end: int
    rep: int                          # a request whose tokens spell this node's path
    blocks: list[int]                 # physical blocks for block indices start//B .. (end-1)//B
    parent: "_Node | None" = None
    children: dict[int, "_Node"] = field(default_factory=dict)
    last_access: int = 0              # logical clock, as RadixTree's LRU
    hits: int = 0
    priority: float = 0.0             # GreedyDual-Size-Frequency value (policy "gdsf")


POLICIES = ("belady", "lru", "gdsf", "random", "popularity", "open_sessions",
            "open_sessions_now")
SESSION_POLICIES = ("open_sessions", "open_sessions_now")


class BeladyCache:
    """Radix-tree KV cache simulator; evicts leaves by ``policy``:

    - ``belady`` (default): offline, the leaf whose next use is furthest in the future;
    - ``lru``: least recently matched or inserted (what RadixTree does; a cross-check);
    - ``gdsf``: GreedyDual-Size-Frequency with cost = size, i.e. priority = L + hits where
      L is the priority of the last evicted leaf (an online, frequency-aware comparison);
    - ``random``: a uniformly random leaf (seeded): what an online policy gets from a trace
      with no recency signal;
    - ``popularity``: the leaf whose prefix the fewest requests of the whole trace share,
      LRU among equals: frequency known perfectly but not when requests come (the best a
      frequency-learning online policy could hope for).
    - ``open_sessions`` (needs ``sessions``, each request's session): the leaf that the
      fewest open sessions (begun, not finished) will send again, then one that no later
      session will send either, LRU among equals. It knows which sessions will come back
      and through which prefixes, but not in what order: when the next request comes from
      an open session picked at random (``workloads.interleave``), keeping what the most
      open sessions share is the best use of memory, so this is a closer reference than
      Belady (which also knows the order) for what an online policy can reach on such a
      trace. A greedy rule (session counts, not tokens) with oracle knowledge, not a
      proven bound.
    - ``open_sessions_now``: the same without knowing later sessions (LRU among leaves no
      open session will send again). A server can know this much when sessions say that
      they will come back, as an agent loop does whose last answer was a tool call; for
      chat, which conversations continue is still an oracle's knowledge.

    With ``trim_tails`` a victim larger than the excess loses only its last blocks (down
    to a block boundary, keeping its first block), as ``RadixTree.evict`` does; without it
    victims go whole (the issue's leaf-eviction baseline).
    """

    def __init__(self, trace: Sequence[tuple[str, Sequence[int]]], block_size: int,
                 policy: str = "belady", trim_tails: bool = False,
                 sessions: Sequence[str] | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; one of {POLICIES}")
        if policy in SESSION_POLICIES and (sessions is None or len(sessions) != len(trace)):
            raise ValueError(f"policy {policy!r} needs the session of every request")
        self.sessions = list(sessions) if sessions is not None else None
        self.opened: dict[str, int] = {}          # session -> index of its first request
        for index, session in enumerate(self.sessions or ()):
            self.opened.setdefault(session, index)
        self.policy = policy
        self.trim_tails = trim_tails
        self.rng = random.Random(0)
        self.tick = 0
        self.inflation = 0.0
        self.oracle = FutureOracle(trace)
        self.tokens = self.oracle.tokens
        self.block_size = block_size
        self.roots: dict[str, _Node] = {}
        self.refs: dict[int, int] = {}        # physical block -> holders (nodes)
        self._next_block = 0

    @property
    def used_blocks(self) -> int:
        return len(self.refs)

    def _new_blocks(self, n: int) -> list[int]:
        self._next_block += n
        return list(range(self._next_block - n, self._next_block))

    def _hold(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            self.refs[b] = self.refs.get(b, 0) + 1

    def match(self, namespace: str, index: int) -> tuple[int, list[int]]:
        """(matched tokens, block table covering them) for request ``index``."""
        tokens, B = self.tokens[index], self.block_size
        node, depth, table = self.roots.get(namespace), 0, []
        self.tick += 1
        while node is not None and depth < len(tokens):
            child = node.children.get(tokens[depth])
            if child is None:
                break
            child.last_access, child.hits = self.tick, child.hits + 1
            child.priority = self.inflation + child.hits
            depth += common_prefix(tokens, self.tokens[child.rep], depth, child.end)
            first_index = child.start // B
            table[first_index:] = child.blocks
            if depth < child.end:
                break
            node = child
        return depth, table[: -(-depth // B)]

    def serve(self, namespace: str, index: int, round_to_block: bool = False) -> int:
        """Run request ``index``: match, allocate, insert its prompt. Returns tokens reused."""
        tokens, B = self.tokens[index], self.block_size
        matched, table = self.match(namespace, index)
        reused = min(matched, len(tokens) - 1)
        if round_to_block:
            reused -= reused % B
        keep = reused // B                    # whole blocks read in place
        table = table[:keep] + self._new_blocks(-(-len(tokens) // B) - keep)
        self._insert(namespace, index, table)
        return reused

    def _insert(self, namespace: str, index: int, table: list[int]) -> None:
        tokens, B = self.tokens[index], self.block_size
        node = self.roots.setdefault(namespace, _Node(0, 0, index, []))
        depth = 0
        self.tick += 1
        while depth < len(tokens):
            child = node.children.get(tokens[depth])
            if child is None:
                if depth % B and node.parent is not None:
                    self._adopt_boundary_block(node, table[depth // B])
                leaf = _Node(depth, len(tokens), index, table[depth // B:], node,
                             last_access=self.tick, priority=self.inflation + 1)
                self._hold(leaf.blocks)
                node.children[tokens[depth]] = leaf
                return
            child.last_access = self.tick
            cut = depth + common_prefix(tokens, self.tokens[child.rep], depth, child.end)
            if cut == len(tokens):
                return                        # the whole prompt is already cached
            if cut < child.end:
                child = self._split(child, cut)
            node, depth = child, cut

    def _adopt_boundary_block(self, node: _Node, block: int) -> None:
        """As ``RadixTree``: a node that ends inside its last block, extended by a request,
        takes the request's copy of that block when no other node holds its own."""
        old = node.blocks[-1]
        if old != block and self.refs.get(old) == 1:
            node.blocks[-1] = block
            self._hold([block])
            self._release(old)

    def _split(self, child: _Node, cut: int) -> _Node:
        B, parent = self.block_size, child.parent
        split_at = cut // B - child.start // B          # blocks of [start, cut)
        upper_blocks = child.blocks[: -(-cut // B) - child.start // B]
        upper = _Node(child.start, cut, child.rep, upper_blocks, parent, last_access=child.last_access,
                      hits=child.hits, priority=child.priority)
        self._hold(upper_blocks)
        parent.children[self.tokens[child.rep][child.start]] = upper
        old = child.blocks
        child.blocks = old[split_at:]
        for b in old[:split_at]:
            self._release(b)
        child.start, child.parent = cut, upper
        upper.children[self.tokens[child.rep][cut]] = child
        return upper

    def _release(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            del self.refs[block]

    def _leaves(self):
        stack = [root for root in self.roots.values()]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node.parent is not None:
                yield node

    def _victim(self, now: int) -> _Node | None:
        if self.policy == "belady":
            return max(self._leaves(), default=None,
                       key=lambda n: (self.oracle.next_use(n.rep, n.start + 1, now), n.end))
        if self.policy == "lru":
            return min(self._leaves(), default=None, key=lambda n: n.last_access)
        if self.policy == "random":
            leaves = list(self._leaves())
            return self.rng.choice(leaves) if leaves else None
        if self.policy == "popularity":
            return min(self._leaves(), default=None, key=lambda n: (
                self.oracle.popularity(n.rep, n.start + 1), n.last_access))
        if self.policy in SESSION_POLICIES:
            return min(self._leaves(), default=None,
                       key=lambda n: (*self._open_sessions_reuse(n, now), n.last_access))
        victim = min(self._leaves(), default=None, key=lambda n: (n.priority, n.last_access))
        if victim is not None:
            self.inflation = victim.priority
        return victim

    def _open_sessions_reuse(self, leaf: _Node, now: int) -> tuple[int, bool]:
        """(open sessions that will send the leaf's first token again, whether any later
        session will; always False for ``open_sessions_now``)."""
        returning = {self.sessions[r]
                     for r in self.oracle.later_requests(leaf.rep, leaf.start + 1, now)}
        open_ = sum(1 for s in returning if self.opened[s] <= now)
        return open_, self.policy == "open_sessions" and len(returning) > open_

    def evict_to(self, budget_blocks: int, now: int) -> None:
        """Evict leaves in policy order until at most ``budget_blocks`` blocks are held."""
        while self.used_blocks > budget_blocks:
            victim = self._victim(now)
            if victim is None:
                return
            excess = self.used_blocks - budget_blocks
            if self.trim_tails and len(victim.blocks) - 1 >= excess:
                self._trim(victim, excess)
                continue
            del victim.parent.children[self.tokens[victim.rep][victim.start]]
            for b in victim.blocks:
                self._release(b)

    def _trim(self, leaf: _Node, num_blocks: int) -> None:
        """Drop the last ``num_blocks`` blocks of ``leaf``; it ends on a block boundary."""
        keep = len(leaf.blocks) - num_blocks
        for b in leaf.blocks[keep:]:
            self._release(b)
        leaf.blocks = leaf.blocks[:keep]
        leaf.end = (leaf.start // self.block_size + keep) * self.block_size
