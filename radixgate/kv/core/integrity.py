"""``check_integrity``: recount every holder, refcount, lock and counter of a tree.

Cost is linear in nodes + blocks; meant for tests and for the engine's idle debug checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .node import TOKEN_BYTES, TreeNode, first_token

if TYPE_CHECKING:
    from .tree import RadixTree


class IntegrityError(AssertionError):
    """The tree, the pool or a counter disagrees with a recount."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise IntegrityError(message)


def expected_locks(tree: RadixTree) -> dict[TreeNode, int]:
    """Lock count every node should have: the sum of the live handles at or below it."""
    locks: dict[TreeNode, int] = {}
    for handle in tree.handles:
        _require(handle.count > 0, f"{handle!r} is registered but holds no lock")
        _require(handle.node.alive, f"{handle!r} holds a lock on an evicted node")
        node = handle.node
        while node.parent is not None:
            locks[node] = locks.get(node, 0) + handle.count
            node = node.parent
    return locks


class _Recount:
    def __init__(self, tree: RadixTree):
        self.tree = tree
        self.policy = tree.policy
        self.now = tree.clock()
        self.B = tree.block_size
        self.locks = expected_locks(tree)
        self.node_refs = [0] * tree.pool.num_blocks
        self.nodes = self.cached = self.evictable = self.locked = self.evictable_blocks = 0
        self.pinned: set[TreeNode] = set()

    def visit(self, parent: TreeNode, first: int, node: TreeNode) -> None:
        where = f"node [{node.start},{node.end}) in namespace {node.ns.name!r}"
        _require(node.alive and node.parent is parent and node.ns is parent.ns, f"{where}: bad links")
        _require(node.start == parent.end and node.end > node.start, f"{where}: bad range")
        _require(len(node.key) == TOKEN_BYTES * node.num_tokens, f"{where}: key length mismatch")
        _require(first_token(node.key) == first, f"{where}: filed under token {first}")
        expected_blocks = (node.end - 1) // self.B - node.start // self.B + 1
        _require(len(node.blocks) == expected_blocks,
                 f"{where}: holds {len(node.blocks)} blocks, covers {expected_blocks}")
        _require(len(set(node.blocks)) == len(node.blocks), f"{where}: holds a block twice")
        _require(node.own_blocks == node.count_own_blocks(), f"{where}: stale own-block count")
        _require(node.policy_state is not None, f"{where}: unknown to the eviction policy")
        _require(parent.parent is None or node.hits <= parent.hits,
                 f"{where}: more hits than its parent (top prefixes rely on it: reports.py)")
        want = self.locks.get(node, 0)
        _require(node.lock_ref == want, f"{where}: lock_ref {node.lock_ref}, handles say {want}")
        for block in node.blocks:
            self.node_refs[block] += 1
        self.nodes += 1
        self.cached += node.num_tokens
        if node.lock_ref:
            self.locked += node.num_tokens
        else:
            self.evictable += node.num_tokens
            self.evictable_blocks += node.own_blocks
            if not node.children:
                watched = node.pin is not None and node.pin.watched
                _require(self.policy.is_queued(node) or watched,
                         f"{where}: evictable leaf missing from the eviction queue")
        if node.pin is not None:
            self.pinned.add(node)
            _require(node.pin.watched or node.pin.expiry <= self.now,
                     f"{where}: unexpired pin not watched (its expiry would go unseen)")

    def walk(self) -> None:
        for ns in self.tree.namespaces:
            root = ns.root
            _require(root.parent is None and root.end == 0 and not root.blocks, f"bad root of {ns.name!r}")
            before_nodes, before_tokens = self.nodes, self.cached
            stack = [root]
            while stack:
                parent = stack.pop()
                for first, child in parent.children.items():
                    self.visit(parent, first, child)
                    stack.append(child)
            _require(ns.nodes == self.nodes - before_nodes, f"namespace {ns.name!r}: node count")
            _require(ns.cached_tokens == self.cached - before_tokens, f"namespace {ns.name!r}: token count")


def check_tree(tree: RadixTree, extra_holders: Iterable[Sequence[int]]) -> None:
    recount = _Recount(tree)
    recount.walk()
    _check_counters(tree, recount)
    _check_pin_totals(tree)
    _check_namespaces(tree)
    _check_blocks(tree, recount.node_refs, extra_holders)


def _check_namespaces(tree: RadixTree) -> None:
    """Every registered namespace is in use and indexed under its tenant; its lock count
    equals its handles' (namespaces.py)."""
    locks: dict[int, int] = {}
    for handle in tree.handles:
        locks[id(handle.node.ns)] = locks.get(id(handle.node.ns), 0) + handle.count
    table = tree.namespaces
    indexed = 0
    for tenant in table.tenants():
        owned = table.of_tenant(tenant)
        indexed += len(owned)
        _require(all(ns.tenant == tenant for ns in owned), f"tenant {tenant!r}: foreign namespace")
    _require(indexed == len(table), f"{indexed} namespaces indexed by tenant, {len(table)} live")
    for ns in table:
        _require(ns.in_use, f"namespace {ns.name!r} is unused but was not dropped")
        _require(table.get(ns.name) is ns, f"namespace {ns.name!r} is filed under another name")
        _require(ns.locks == locks.get(id(ns), 0),
                 f"namespace {ns.name!r}: {ns.locks} locks, handles say {locks.get(id(ns), 0)}")
        _require(ns.users >= 0, f"namespace {ns.name!r}: {ns.users} users")


def _check_counters(tree: RadixTree, r: _Recount) -> None:
    pairs = {
        "nodes": (tree.num_nodes, r.nodes),
        "cached_tokens": (tree.cached_tokens, r.cached),
        "evictable_tokens": (tree.evictable_tokens, r.evictable),
        "locked_tokens": (tree.locked_tokens, r.locked),
        "evictable_blocks": (tree.evictable_blocks, r.evictable_blocks),
    }
    for name, (kept, counted) in pairs.items():
        _require(kept == counted, f"counter {name} is {kept}, recount gives {counted}")
    _require(tree.pins.nodes == r.pinned, "pinned-node registry disagrees with the nodes' pins")
    held = {block: n for block, n in enumerate(r.node_refs) if n}
    _require(tree.block_holders == held, "block_holders disagrees with the nodes' block lists")


def _check_pin_totals(tree: RadixTree) -> None:
    """The running pin totals equal a walk over every unexpired pin's path."""
    totals = tree.pins.totals(tree.clock())
    now = tree.clock()
    owners: dict[str, set] = {}
    nodes: set[TreeNode] = set()
    for node in tree.pins.nodes:
        _require(node.pin.counted == (node.pin.expiry > now),
                 f"pin at {node.end} counted={node.pin.counted} but expires at {node.pin.expiry}")
        if node.pin.counted:
            owners.setdefault(node.pin.owner, set()).update(node.path())
            nodes.update(node.path())
    _require(set(tree.pins.paths) == nodes, "pinned-path marks disagree with the pins' paths")
    blocks: dict[int, int] = {}
    by_ns: dict[str, int] = {}
    for node in nodes:
        for block in node.blocks:
            blocks[block] = blocks.get(block, 0) + 1
        by_ns[node.ns.name] = by_ns.get(node.ns.name, 0) + node.num_tokens
    by_owner = {owner: sum(n.num_tokens for n in path) for owner, path in owners.items()}
    _require(totals.tokens == sum(n.num_tokens for n in nodes),
             f"pinned tokens {totals.tokens}, recount gives {sum(n.num_tokens for n in nodes)}")
    _require(totals.tokens_by_owner == by_owner,
             f"pinned tokens by owner {totals.tokens_by_owner}, recount gives {by_owner}")
    _require(totals.tokens_by_namespace == by_ns,
             f"pinned tokens by namespace {totals.tokens_by_namespace}, recount gives {by_ns}")
    _require(totals.block_holders == blocks, "pinned block holders disagree with the pinned paths")


def _check_blocks(tree: RadixTree, node_refs: list[int], extra_holders) -> None:
    pool = tree.pool
    refs = list(node_refs)
    for table in extra_holders:
        for block in table:
            _require(0 <= block < pool.num_blocks, f"extra holder names unknown block {block}")
            refs[block] += 1
    free = pool.free_blocks()
    free_set = set(free)
    _require(len(free_set) == len(free), "free list holds a block twice")
    for block, count in enumerate(refs):
        actual = pool.refcount(block)
        _require(actual == count, f"block {block}: refcount {actual}, holders recounted {count}")
        _require((count == 0) == (block in free_set),
                 f"block {block}: {count} holders but {'on' if block in free_set else 'off'} the free list")
    held = sum(1 for count in refs if count)
    _require(len(free) + held == pool.num_blocks,
             f"free {len(free)} + held {held} != num_blocks {pool.num_blocks}")
