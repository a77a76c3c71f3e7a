"""Running totals of what unexpired pins hold: tokens per owner, per namespace and in all,
and the distinct blocks on pinned paths.

The engine asks for these on every request (the tenant's pin quota, the pin share of the
KV budget, the blocks a prompt can never get), so they must not cost a walk over every
pin's path. A pin is *counted* from when it is set (or re-armed by a hit after it expired)
until ``settle`` sees it expired or it is dropped; counting adds it to every node on its
path. Per node, ``pin_paths`` maps owner -> counted pins at or below the node; a node is
on a pinned path while that map is non-empty, and its tokens count once per owner (and
once in all) however many pins lie below it.

Expiry is lazy, like the eviction queue's: a heap of ``(time, seq, node, pin)``;
``pin.settle_at`` is the time of the pin's newest entry, so older entries are skipped. A
hit that moved the expiry later is found when the entry comes due and pushed again.
Structure changes that keep a pin's path but change its nodes' blocks (a split, an
adopted boundary block) go through ``rehold``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import count

from .node import Pin, TreeNode


class PinTotals:
    def __init__(self) -> None:
        self.tokens = 0                                 # distinct pinned-path tokens
        self.tokens_by_owner: dict[str, int] = {}
        self.tokens_by_namespace: dict[str, int] = {}
        self.block_holders: dict[int, int] = {}        # block -> pinned-path nodes holding it
        self.counted_pins = 0
        self._due: list[tuple[float, int, TreeNode, Pin]] = []
        self._seq = count()

    # ---- pins coming and going ------------------------------------------------------

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

    def settle(self, now: float) -> None:
        """Uncount every pin that has expired by ``now`` (and not been re-armed)."""
        due = self._due
        while due and due[0][0] <= now:
            when, _, node, pin = heapq.heappop(due)
            if not _current(when, node, pin):
                continue                    # superseded or already out of the totals
            if pin.expiry > now:
                self._schedule(node, pin)   # a hit re-armed it since
            else:
                self.uncount(node, pin)

    # ---- nodes changing under counted pins ------------------------------------------

    def rehold(self, node: TreeNode, old_blocks: Sequence[int]) -> None:
        """``node``'s block list changed from ``old_blocks`` (a split gave its head to a new
        parent, which ``adopt_split`` accounts for)."""
        if node.pin_paths:
            self._add_blocks(old_blocks, -1)
            self._add_blocks(node.blocks, +1)

    def swap_block(self, node: TreeNode, old: int, new: int) -> None:
        """``node`` took block ``new`` in place of ``old`` (an adopted boundary block)."""
        if node.pin_paths:
            self._add_blocks((old,), -1)
            self._add_blocks((new,), +1)

    def adopt_split(self, upper: TreeNode, lower: TreeNode) -> None:
        """``upper`` was cut off the top of ``lower``: every pin below ``lower`` is below it
        too. Tokens are unchanged (they moved between the two); blocks go via ``rehold``."""
        if lower.pin_paths:
            upper.pin_paths = dict(lower.pin_paths)
            self._add_blocks(upper.blocks, +1)

    # ---- internals ------------------------------------------------------------------

    def _schedule(self, node: TreeNode, pin: Pin) -> None:
        pin.settle_at = pin.expiry
        heapq.heappush(self._due, (pin.expiry, next(self._seq), node, pin))
        if len(self._due) > 2 * self.counted_pins + 1024:
            self._due = [e for e in self._due if _current(e[0], e[2], e[3])]
            heapq.heapify(self._due)

    def _walk(self, node: TreeNode, owner: str, sign: int) -> None:
        """Count (+1) or uncount (-1) one pin of ``owner`` on every node of its path."""
        while node.parent is not None:
            paths = node.pin_paths
            if paths is None:
                paths = node.pin_paths = {}
            had_any = bool(paths)
            left = paths.get(owner, 0) + sign
            if left:
                paths[owner] = left
            else:
                del paths[owner]
            if left == (1 if sign > 0 else 0):     # this owner's first pin here, or last
                _bump(self.tokens_by_owner, owner, sign * node.num_tokens)
            if had_any != bool(paths):
                self.tokens += sign * node.num_tokens
                _bump(self.tokens_by_namespace, node.ns.name, sign * node.num_tokens)
                self._add_blocks(node.blocks, sign)
            if not paths:
                node.pin_paths = None
            node = node.parent

    def _add_blocks(self, blocks: Sequence[int], sign: int) -> None:
        for block in blocks:
            _bump(self.block_holders, block, sign)

    def __len__(self) -> int:
        return len(self._due)


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
