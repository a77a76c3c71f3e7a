"""Pins: keep a prefix cached for ``ttl_s`` seconds after its last hit (injectable clock).

A pin sits on one node; since eviction only takes leaves, the pin protects the node's whole
path. An expired pin is an ordinary eviction candidate (evicted with reason ``ttl``); a hit
before eviction re-arms it (``expiry = now + ttl_s``).

``Pins`` is the tree's one record of them. Its contract:

- the tree tells it every pin set, hit (``refresh``) and dropped, and every change of a
  pinned path's shape (``split``, ``swap_block``); a removed node has no pin and no counted
  pin below it (the tree drops a node's pin before removing it);
- ``protects(node, now)``: eviction must skip ``node`` (an unexpired pin). Every unexpired
  pin is *watched*: ``release_expired(now)`` hands back each unlocked leaf whose pin has
  expired since, so the eviction policy can offer it again;
- ``totals(now)``: tokens per owner, per namespace and in all, and the distinct blocks, on
  the paths to unexpired pins, kept current (no walk over the pins).

Totals. A pin is *counted* from when it is set (or re-armed by a hit after it expired)
until ``settle`` sees it expired or it is dropped; counting adds it to every node on its
path. Per node, ``paths`` maps owner -> counted pins at or below the node; a node is on a
pinned path while it has an entry, and its tokens count once per owner (and once in all)
however many pins lie below it.

Expiry is lazy: two heaps of ``(time, seq, node, pin)``, one for eviction (``watched``)
and one for the totals (``settle_at``: the time of the pin's newest entry, so older entries
are skipped). A hit that moved the expiry later is found when the entry comes due and is
pushed again.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count

from .node import TreeNode


@dataclass(slots=True, eq=False)
class Pin:
    """Every hit sets ``expiry = now + ttl_s``. ``watched`` while it has an entry in the
    expiry heap; ``counted`` while it is in the totals."""

    ttl_s: float
    owner: str
    expiry: float
    watched: bool = False
    counted: bool = False
    settle_at: float | None = None    # time of its newest due entry (totals)


@dataclass(slots=True)
class PinTotals:
    """What unexpired pins hold (read ``Pins.totals(now)``; counters only change there)."""

    tokens: int = 0                                    # distinct pinned-path tokens
    tokens_by_owner: dict[str, int] = field(default_factory=dict)
    tokens_by_namespace: dict[str, int] = field(default_factory=dict)
    block_holders: dict[int, int] = field(default_factory=dict)   # block -> pinned-path nodes


class Pins:
    def __init__(self) -> None:
        self.nodes: set[TreeNode] = set()               # nodes with a pin
        self.paths: dict[TreeNode, dict[str, int]] = {}  # node -> owner -> counted pins below
        self.counted = PinTotals()
        self.counted_pins = 0
        self.expiries: list[tuple[float, int, TreeNode, Pin]] = []   # eviction's watch
        self.due: list[tuple[float, int, TreeNode, Pin]] = []        # the totals' settle
        self.seq = count()

    # ---- pins coming and going ------------------------------------------------------

    def set(self, node: TreeNode, ttl_s: float, owner: str, now: float) -> None:
        """Pin ``node`` until ``now + ttl_s`` (extended by every hit); re-pinning replaces
        owner and ttl in place."""
        expiry = now + ttl_s
        old = node.pin
        if old is not None:
            # re-pinned (every request repeating a breakpoint): update in place, so the expiry
            # heap gets no new entry unless the pin now ends sooner than its queued time
            if expiry < old.expiry:
                old.watched = False
            if owner != old.owner:
                self.uncount(node, old)
            old.ttl_s, old.owner, old.expiry = ttl_s, owner, expiry
        else:
            node.pin = Pin(ttl_s, owner, expiry)
            self.nodes.add(node)
        self.watch(node, node.pin)
        self.count(node, node.pin)

    def refresh(self, node: TreeNode, now: float) -> None:
        """A hit: the pin now expires ``ttl_s`` from ``now``."""
        pin = node.pin
        pin.expiry = now + pin.ttl_s
        self.watch(node, pin)
        self.count(node, pin)        # re-arms a pin that had expired

    def drop(self, node: TreeNode) -> None:
        """Remove ``node``'s pin (the caller offers the node for eviction again)."""
        self.uncount(node, node.pin)
        node.pin = None
        self.nodes.discard(node)

    # ---- eviction's view -----------------------------------------------------------

    def protects(self, node: TreeNode, now: float) -> bool:
        pin = node.pin
        return pin is not None and pin.expiry > now

    def watch(self, node: TreeNode, pin: Pin) -> None:
        """Track ``pin``'s expiry (a no-op if already tracked; stale times are fixed lazily)."""
        if not pin.watched:
            pin.watched = True
            heapq.heappush(self.expiries, (pin.expiry, next(self.seq), node, pin))

    def release_expired(self, now: float) -> list[TreeNode]:
        """Unlocked leaves whose pin has expired by ``now`` (since the last call)."""
        released = []
        expiries = self.expiries
        while expiries and expiries[0][0] <= now:
            _, _, node, pin = heapq.heappop(expiries)
            pin.watched = False
            if node.pin is not pin or not node.alive:
                continue
            if pin.expiry > now:           # refreshed by a hit since it was pushed
                self.watch(node, pin)
            elif not node.children and node.lock_ref == 0:
                released.append(node)
        return released

    def compact(self) -> None:
        """Drop expiry entries of removed nodes and dropped pins."""
        kept = []
        for entry in self.expiries:
            node, pin = entry[2], entry[3]
            if node.alive and node.pin is pin:
                kept.append(entry)
            else:
                pin.watched = False
        heapq.heapify(kept)
        self.expiries = kept

    def heap_size(self) -> int:
        return len(self.expiries) + len(self.due)

    # ---- totals ----------------------------------------------------------------------

    def totals(self, now: float) -> PinTotals:
        """The totals with every pin expired by ``now`` taken out."""
        due = self.due
        while due and due[0][0] <= now:
            when, _, node, pin = heapq.heappop(due)
            if not _current(when, node, pin):
                continue                    # superseded or already out of the totals
            if pin.expiry > now:
                self._schedule(node, pin)   # a hit re-armed it since
            else:
                self.uncount(node, pin)
        return self.counted

    def on_path(self, node: TreeNode, owner: str | None = None) -> bool:
        """Whether a counted pin (of ``owner``, or of anyone) lies at or below ``node``
        (current after ``totals(now)``)."""
        paths = self.paths.get(node)
        return bool(paths) if owner is None else bool(paths and paths.get(owner))

    def count(self, node: TreeNode, pin: Pin) -> None:
        """Add ``pin`` (on ``node``) to the totals; a no-op if it is counted already, except
        that a pin whose expiry moved earlier gets a new (earlier) due entry."""
        if not pin.counted:
            pin.counted = True
            self.counted_pins += 1
            self._walk(node, pin.owner, +1)
        if pin.settle_at is None or pin.expiry < pin.settle_at:
            self._schedule(node, pin)

    def uncount(self, node: TreeNode, pin: Pin) -> None:
        """Take ``pin`` out of the totals (dropped, expired, or about to change owner)."""
        if pin.counted:
            pin.counted = False
            pin.settle_at = None
            self.counted_pins -= 1
            self._walk(node, pin.owner, -1)

    # ---- nodes changing under counted pins ------------------------------------------

    def split(self, upper: TreeNode, lower: TreeNode, old_blocks: Sequence[int]) -> None:
        """``upper`` was cut off the top of ``lower`` (whose blocks were ``old_blocks``):
        every pin below ``lower`` is below it too. Tokens are unchanged (they moved between
        the two); the blocks are re-counted."""
        paths = self.paths.get(lower)
        if paths:
            self.paths[upper] = dict(paths)
            self._add_blocks(upper.blocks, +1)
            self._add_blocks(old_blocks, -1)
            self._add_blocks(lower.blocks, +1)

    def swap_block(self, node: TreeNode, old: int, new: int) -> None:
        """``node`` took block ``new`` in place of ``old`` (an adopted boundary block)."""
        if self.paths.get(node):
            self._add_blocks((old,), -1)
            self._add_blocks((new,), +1)

    # ---- internals ------------------------------------------------------------------

    def _schedule(self, node: TreeNode, pin: Pin) -> None:
        pin.settle_at = pin.expiry
        heapq.heappush(self.due, (pin.expiry, next(self.seq), node, pin))
        if len(self.due) > 2 * self.counted_pins + 1024:
            self.due = [e for e in self.due if _current(e[0], e[2], e[3])]
            heapq.heapify(self.due)

    def _walk(self, node: TreeNode, owner: str, sign: int) -> None:
        """Count (+1) or uncount (-1) one pin of ``owner`` on every node of its path."""
        totals, all_paths = self.counted, self.paths
        while node.parent is not None:
            paths = all_paths.get(node)
            if paths is None:
                paths = all_paths[node] = {}
            had_any = bool(paths)
            left = paths.get(owner, 0) + sign
            if left:
                paths[owner] = left
            else:
                del paths[owner]
            if left == (1 if sign > 0 else 0):     # this owner's first pin here, or last
                _bump(totals.tokens_by_owner, owner, sign * node.num_tokens)
            if had_any != bool(paths):
                totals.tokens += sign * node.num_tokens
                _bump(totals.tokens_by_namespace, node.ns.name, sign * node.num_tokens)
                self._add_blocks(node.blocks, sign)
            if not paths:
                del all_paths[node]
            node = node.parent

    def _add_blocks(self, blocks: Sequence[int], sign: int) -> None:
        holders = self.counted.block_holders
        for block in blocks:
            _bump(holders, block, sign)


def _current(when: float, node: TreeNode, pin: Pin) -> bool:
    """Whether a due entry for ``pin`` at ``when`` is its newest and the pin still counts."""
    return when == pin.settle_at and pin.counted and node.pin is pin


def _bump(counter: dict, key, delta: int) -> None:
    """Add ``delta`` to ``counter[key]``, dropping the key when it reaches 0."""
    value = counter.get(key, 0) + delta
    if value:
        counter[key] = value
    else:
        counter.pop(key, None)
