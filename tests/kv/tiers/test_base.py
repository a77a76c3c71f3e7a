"""The lower-tier protocol (kv/tiers/base.py): the disk tier and the in-memory tier of the
manager's tests implement every method of it with its parameters, so either plugs into the
manager and the tree; the tree's eviction hook stages an evicted node's whole path."""
from __future__ import annotations

import inspect

import pytest

from radixgate.kv.manager import KVManager
from radixgate.kv.tiers.base import LowerTier, spill_to
from radixgate.kv.tiers.disk import KVTier, LoadTicket
from tests.support.kv_fakes import FakeKV, FakeLoad, MemoryTier, compute, main_pool, seq_of, \
    tree_over


def protocol_members(protocol) -> list[str]:
    return sorted(name for name in vars(protocol)
                  if not name.startswith("_") and callable(getattr(protocol, name)))


def parameters(function) -> list[inspect.Parameter]:
    return list(inspect.signature(function).parameters.values())


@pytest.mark.parametrize("implementation", [KVTier, MemoryTier])
def test_a_tier_implements_every_method_of_the_protocol(implementation):
    methods = protocol_members(LowerTier)
    assert {"find", "load", "spill", "purge"} <= set(methods)
    for name in methods:
        wanted = parameters(getattr(LowerTier, name))
        has = parameters(getattr(implementation, name))
        assert [p.name for p in has[:len(wanted)]] == [p.name for p in wanted], name
        assert all(p.default is not p.empty for p in has[len(wanted):]), name   # extras optional


@pytest.mark.parametrize("implementation", [LoadTicket, FakeLoad])
def test_a_load_implements_the_load_job(implementation):
    for name in ("cancel", "wait", "length"):
        assert hasattr(implementation, name), name


def test_no_tier_no_hook_and_the_hook_stages_the_evicted_path():
    assert spill_to(None) is None
    kv = FakeKV(16, 4)
    pool = main_pool(16, 4)
    tier = MemoryTier(kv)
    tree = tree_over(pool, tier)
    m = KVManager(tree, pool, kv, tier=tier)
    seq = seq_of(range(8))
    assert m.admit(seq, None)
    compute(m, kv, seq)
    m.release(seq)
    branch = seq_of(list(range(8)) + [40, 41, 42, 43])
    assert m.admit(branch, m.match(branch))
    compute(m, kv, branch)
    m.release(branch)
    assert tree.evict(1) == 1                    # the branch's own block goes
    assert len(tier.stored) == 3                 # with its parent path: found from block 0
    m.close()
    assert tier.closed and tree.evict(2) == 2 and len(tier.stored) == 3
    tree.check_integrity()


def test_a_closed_disk_tier_stages_nothing():
    """After ``close`` (the manager's, at shutdown) the tree's hook may still fire (a flush,
    a late eviction): the disk tier copies nothing out any more."""
    from radixgate.kv.tiers.disk import MemoryBackend
    from radixgate.runtime.model.kv_cache import KVCache

    kv = KVCache(2, 16, 4, 2, 8, "float32")
    tier = KVTier(MemoryBackend(), kv, b"f" * 16, budget_bytes=100_000, kind="memory")
    assert tier.spill("ns", list(range(8)), 0, 8, [0, 1]) == 2
    tier.close()
    assert tier.spill("ns", list(range(100, 108)), 0, 8, [2, 3]) == 0
    assert tier.stats().staged_bytes == 0
