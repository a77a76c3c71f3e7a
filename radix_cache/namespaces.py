"""Namespaces: one root (and one set of counters) per namespace string.

A match never crosses namespaces: each namespace is its own subtree with its own root.
"""

from __future__ import annotations

from .node import TreeNode


class Namespace:
    """A namespace's root node and its per-namespace counters."""

    __slots__ = ("name", "root", "nodes", "cached_tokens", "queries", "query_tokens", "hit_tokens")

    def __init__(self, name: str):
        self.name = name
        self.root = TreeNode(b"", 0, 0, [], None, self)
        self.nodes = 0             # nodes below the root
        self.cached_tokens = 0     # sum of node lengths
        self.queries = 0           # match() calls
        self.query_tokens = 0      # tokens asked for by match()
        self.hit_tokens = 0        # tokens matched by match()


class NamespaceTable:
    """Maps namespace strings to ``Namespace`` objects, creating them on first use."""

    def __init__(self):
        self._by_name: dict[str, Namespace] = {}

    def get_or_create(self, name: str) -> Namespace:
        if not isinstance(name, str):
            raise TypeError(f"namespace must be a str, got {type(name).__name__}")
        ns = self._by_name.get(name)
        if ns is None:
            ns = self._by_name[name] = Namespace(name)
        return ns

    def get(self, name: str) -> Namespace | None:
        return self._by_name.get(name)

    def select(self, name: str | None) -> list[Namespace]:
        """All namespaces (``name is None``) or the one named (empty if unknown)."""
        if name is None:
            return list(self._by_name.values())
        ns = self._by_name.get(name)
        return [ns] if ns is not None else []

    def __iter__(self):
        return iter(self._by_name.values())
