"""Namespaces: one root (and one set of counters) per namespace string, and their lifetime.

A match never crosses namespaces: each namespace is its own subtree with its own root.

Lifetime. A namespace exists while it is *in use*: it holds nodes (cached tokens; pins sit
on nodes), a lock handle names one of its nodes or its root (``locks``), or the engine has
it open for a request that has not finished (``users``, ``open_namespace`` ..
``close_namespace``). The moment none of these holds it is dropped (O(1), at the removal,
unlock or close that emptied it), so 20,000 one-off ``cache_salt`` values leave nothing
behind once their content is evicted.

Cap. Each namespace belongs to a tenant (set by ``open_namespace``; "" for namespaces
created by a bare ``match``/``insert``). ``open_namespace`` and ``close_namespace`` keep a
tenant's live namespaces within its ``max_namespaces``: least recently opened first, an
idle namespace (no users, no locks) gives up everything not on the path to an unexpired
pin and is dropped. A namespace that is busy (a request waits or runs in it, or an
unexpired pin holds content) is skipped, so a tenant may exceed its cap temporarily by its
running and queued requests and its pinned prefixes (all bounded by its other quotas); the
excess is given back as those finish. Nothing here iterates over all namespaces.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from .node import TreeNode

if TYPE_CHECKING:
    from .tree import RadixTree


class Namespace:
    """A namespace's root node, its owner and its per-namespace counters."""

    __slots__ = ("name", "tenant", "root", "nodes", "cached_tokens", "queries", "query_tokens",
                 "hit_tokens", "users", "locks")

    def __init__(self, name: str, tenant: str = ""):
        self.name = name
        self.tenant = tenant       # whose requests use it ("" until opened by one)
        self.root = TreeNode(b"", 0, 0, [], None, self)
        self.nodes = 0             # nodes below the root
        self.cached_tokens = 0     # sum of node lengths
        self.queries = 0           # match() calls
        self.query_tokens = 0      # tokens asked for by match()
        self.hit_tokens = 0        # tokens matched by match()
        self.users = 0             # open requests (open_namespace minus close_namespace)
        self.locks = 0             # locks held by handles on its nodes or its root

    @property
    def in_use(self) -> bool:
        return bool(self.nodes or self.users or self.locks)


class NamespaceTable:
    """Maps namespace strings to ``Namespace`` objects, creating them on first use and
    dropping them when unused; indexes them by tenant in least recently opened order."""

    def __init__(self):
        self._by_name: dict[str, Namespace] = {}
        self._by_tenant: dict[str, OrderedDict[str, Namespace]] = {}
        self.caps: dict[str, int | None] = {}       # tenant -> max_namespaces (last opened with)

    def get_or_create(self, name: str, tenant: str = "") -> Namespace:
        if not isinstance(name, str):
            raise TypeError(f"namespace must be a str, got {type(name).__name__}")
        ns = self._by_name.get(name)
        if ns is None:
            ns = self._by_name[name] = Namespace(name, tenant)
            self._by_tenant.setdefault(tenant, OrderedDict())[name] = ns
        return ns

    def get(self, name: str) -> Namespace | None:
        return self._by_name.get(name)

    def claim(self, ns: Namespace, tenant: str) -> None:
        """``ns`` was just used by ``tenant``: it becomes that tenant's if it had no owner
        yet (a namespace keeps its first owner), and its most recently used."""
        if not ns.tenant and tenant:
            self._unindex(ns)
            ns.tenant = tenant
            self._by_tenant.setdefault(tenant, OrderedDict())[ns.name] = ns
        else:
            self._by_tenant[ns.tenant].move_to_end(ns.name)

    def drop_if_unused(self, ns: Namespace) -> bool:
        """Forget ``ns`` when nothing holds it any more (no nodes, users or locks)."""
        if ns.in_use or self._by_name.get(ns.name) is not ns:
            return False
        del self._by_name[ns.name]
        self._unindex(ns)
        return True

    def _unindex(self, ns: Namespace) -> None:
        owned = self._by_tenant[ns.tenant]
        del owned[ns.name]
        if not owned:
            del self._by_tenant[ns.tenant]

    def of_tenant(self, tenant: str) -> list[Namespace]:
        """``tenant``'s live namespaces, least recently opened first."""
        owned = self._by_tenant.get(tenant)
        return list(owned.values()) if owned else []

    def count_of(self, tenant: str) -> int:
        owned = self._by_tenant.get(tenant)
        return len(owned) if owned else 0

    def tenants(self) -> list[str]:
        """Tenants owning at least one live namespace ("" for unowned ones)."""
        return list(self._by_tenant)

    def select(self, name: str | None) -> list[Namespace]:
        """All namespaces (``name is None``) or the one named (empty if unknown)."""
        if name is None:
            return list(self._by_name.values())
        ns = self._by_name.get(name)
        return [ns] if ns is not None else []

    def __iter__(self):
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)


# ---- the engine's requests opening and closing namespaces -------------------------------

def open_namespace(tree: RadixTree, name: str, tenant: str,
                   max_namespaces: int | None = None) -> Namespace:
    """A request of ``tenant`` arrived for ``name``: create it if needed, hold it open until
    ``close_namespace`` and make it the tenant's most recent; then bring the tenant back
    within ``max_namespaces`` (None: no cap) by dropping its least recently opened idle
    namespaces."""
    table = tree.namespaces
    ns = table.get_or_create(name, tenant)
    ns.users += 1
    table.claim(ns, tenant)
    table.caps[tenant] = max_namespaces
    enforce_cap(tree, tenant)
    return ns


def close_namespace(tree: RadixTree, name: str) -> None:
    """The request that opened ``name`` finished (after caching what it computed): drop the
    namespace if that left it unused, else apply its tenant's cap again (the namespace may
    have been over it while busy)."""
    ns = tree.namespaces.get(name)
    if ns is None or ns.users <= 0:
        raise ValueError(f"close of namespace {name!r} that is not open")
    ns.users -= 1
    if not tree.namespaces.drop_if_unused(ns):
        enforce_cap(tree, ns.tenant)


def enforce_cap(tree: RadixTree, tenant: str) -> int:
    """Evict idle namespaces of ``tenant``, least recently opened first, until it has no
    more than its cap (or only busy ones are left); returns the blocks freed. Costs a look
    at the tenant's namespaces only when it is over its cap."""
    table = tree.namespaces
    cap = table.caps.get(tenant)
    if cap is None or table.count_of(tenant) <= cap:
        return 0
    freed = 0
    excess = table.count_of(tenant) - cap
    for ns in table.of_tenant(tenant):
        if excess <= 0:
            break
        if ns.users or ns.locks:
            continue
        freed += tree.evict_unpinned(ns)
        if not ns.in_use:              # dropped (evicted to nothing)
            excess -= 1
    return freed
