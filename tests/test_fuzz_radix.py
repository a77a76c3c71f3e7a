"""The radix-tree state machine of ``test_radix_stateful.py`` under a tight pool (issue 8,
long mode only): with 10 blocks of 4 slots every request competes for memory, so
allocation failures, eviction of parents after their last child, copy-on-write under
pressure and pins that hold most of the pool are exercised far more often than with the
default 40 blocks. Reuses the machine's rules; only the pool size and the checks that name
it change."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant

from radixgate.radix_cache import BlockPool, RadixTree
from tests.test_radix_stateful import B, RadixMachine

TIGHT_BLOCKS = 10


class TightPoolRadixMachine(RadixMachine):
    def __init__(self):
        super().__init__()
        self.pool = BlockPool(TIGHT_BLOCKS, B)
        self.tree = RadixTree(self.pool, clock=self.clock)

    @invariant()
    def integrity(self):
        tables = [request.table for request in self.running]
        self.tree.check_integrity(extra_holders=tables)
        held = set(self.tree.held_blocks()).union(*tables)
        assert self.pool.num_free() + len(held) == TIGHT_BLOCKS
        stats = self.tree.stats()
        assert stats.cached_tokens == stats.evictable_tokens + stats.locked_tokens

    def teardown(self):
        for request in list(self.running):
            self.release(request)
        for handle in self.extra_locks:
            self.tree.unlock(handle)
        self.tree.flush()
        self.tree.check_integrity()
        assert self.pool.num_free() == TIGHT_BLOCKS, "blocks leaked after everyone let go"


TestTightPoolRadixMachine = pytest.mark.timeout(1800)(
    pytest.mark.slow(TightPoolRadixMachine.TestCase))
TestTightPoolRadixMachine.settings = settings(
    max_examples=500, stateful_step_count=100, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow])
