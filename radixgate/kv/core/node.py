"""Tree nodes, lock handles, and the compact token encoding the tree compares on.

Tokens are stored as packed native int32 bytes (4 bytes a token): an edge matches a query
slice with one bytes comparison (a memcmp), never a per-token Python loop. A query is packed
edge by edge with ``struct.pack`` (several times faster than ``array('i', list)``), so only
the matched part plus one edge is ever packed; an ``array('i')`` query is sliced and copied.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

TOKEN_BYTES = 4
assert array("i").itemsize == TOKEN_BYTES, "radixgate.kv needs a 4-byte C int"
_first_token = struct.Struct("i").unpack_from


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """``tokens`` as packed native int32 bytes (struct.error if a token does not fit)."""
    if isinstance(tokens, array) and tokens.typecode == "i":
        return tokens.tobytes()
    return struct.pack(f"{len(tokens)}i", *tokens)


def token_array(tokens: Sequence[int]) -> array:
    """``tokens`` as ``array('i')``, built via ``struct.pack`` (faster than ``array('i', list)``).

    Pass the same array to ``match`` and ``insert`` (and grow it with ``append``): the tree
    then compares memory directly instead of packing the Python ints on every call.
    """
    if isinstance(tokens, array) and tokens.typecode == "i":
        return tokens
    arr = array("i")
    arr.frombytes(pack_tokens(tokens))
    return arr


def match_edge(key: bytes, tokens: Sequence[int], pos: int) -> int:
    """How many leading tokens of edge ``key`` equal ``tokens[pos:]`` (>= 1 when the caller
    found the edge by its first token)."""
    segment = pack_tokens(tokens[pos:pos + len(key) // TOKEN_BYTES])
    if segment == key:
        return len(key) // TOKEN_BYTES
    return common_prefix_tokens(key, segment, 0)


def first_token(key: bytes) -> int:
    return _first_token(key, 0)[0]


def common_prefix_tokens(key: bytes, data: bytes, offset: int) -> int:
    """Number of whole tokens that ``key`` and ``data[offset:]`` share (binary search on memcmp)."""
    view = memoryview(key)
    lo, hi = 0, min(len(key), len(data) - offset) // TOKEN_BYTES
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if data.startswith(view[: mid * TOKEN_BYTES], offset):
            lo = mid
        else:
            hi = mid - 1
    return lo


class TreeNode:
    """An edge of the radix tree covering token positions ``[start, end)``.

    ``blocks`` holds the block ids for block indices ``start // B .. (end - 1) // B``; when
    ``start`` falls inside a block the parent holds that boundary block too (each holder has
    its own reference). ``own_blocks`` counts the blocks the parent does not hold.
    ``lock_ref`` is the number of lock handles at or below this node; ``hits`` the matches
    that reached it or a descendant; ``pin`` its pin (``pins.Pin``), if any.
    ``policy_state`` belongs to the tree's eviction policy (``policy/``): nothing else reads
    or writes it.
    """

    __slots__ = ("key", "start", "end", "blocks", "children", "parent", "ns", "lock_ref",
                 "hits", "pin", "alive", "own_blocks", "policy_state")

    def __init__(self, key: bytes, start: int, end: int, blocks: list[int],
                 parent: TreeNode | None, ns):
        self.key = key              # packed int32 tokens of [start, end)
        self.start = start
        self.end = end
        self.blocks = blocks
        self.children: dict[int, TreeNode] = {}
        self.parent = parent
        self.ns = ns                # the Namespace this node belongs to
        self.lock_ref = 0
        self.hits = 0
        self.pin = None
        self.alive = True
        self.own_blocks = 0
        self.policy_state = None

    @property
    def num_tokens(self) -> int:
        return self.end - self.start

    def count_own_blocks(self) -> int:
        """Blocks of this node that its parent does not hold (the boundary block may be shared)."""
        parent_blocks = self.parent.blocks if self.parent is not None else ()
        shared = bool(parent_blocks) and parent_blocks[-1] == self.blocks[0]
        return len(self.blocks) - shared

    def path(self) -> list[TreeNode]:
        """This node and its ancestors down from the namespace root (root excluded)."""
        path = []
        node = self
        while node.parent is not None:
            path.append(node)
            node = node.parent
        path.reverse()
        return path

    def path_blocks(self, block_size: int) -> list[int]:
        """The blocks for block indices ``0 .. (end - 1) // block_size`` along the path from
        the namespace root: for each index, the block of the deepest node covering it (the
        one whose slots are valid up to that node's end)."""
        blocks: list[int] = []
        for node in self.path():
            del blocks[node.start // block_size:]
            blocks.extend(node.blocks)
        return blocks

    def path_tokens(self) -> tuple[int, ...]:
        """All token ids from the namespace root down to this node's end."""
        keys = []
        node = self
        while node is not None:
            keys.append(node.key)
            node = node.parent
        return tuple(array("i", b"".join(reversed(keys))))

    def __repr__(self) -> str:
        return f"TreeNode([{self.start},{self.end}) blocks={self.blocks} lock={self.lock_ref})"


class LockHandle:
    """Proof that a path is locked. ``tree.unlock(handle)`` exactly once per lock taken.

    A handle names the deepest node of a match or insert; it stays valid across splits
    (the node keeps its identity as the lower half and the new parent inherits the lock).
    """

    __slots__ = ("node", "count")

    def __init__(self, node: TreeNode):
        self.node = node
        self.count = 0

    @property
    def locked(self) -> bool:
        return self.count > 0

    def __repr__(self) -> str:
        return f"LockHandle(end={self.node.end}, count={self.count})"
