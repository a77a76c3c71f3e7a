"""The radix-tree state machine of ``tests/kv/core/test_tree_stateful.py`` under a tight pool (long mode only): with 10 blocks of 4 slots every request competes for memory, so
allocation failures, eviction of parents after their last child, copy-on-write under
pressure and pins that hold most of the pool are exercised far more often than with the
default 40 blocks. Reuses the machine's rules and checks (they read the pool's own size); only
the pool size changes."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from radixgate.kv import BlockPool, CreditParams, CreditPolicy, LRUPolicy, RadixTree
from tests.kv.core.test_tree_stateful import B, RadixMachine, machine_for

TIGHT_BLOCKS = 10
POLICIES = {"credit": lambda: CreditPolicy(CreditParams()), "lru": LRUPolicy}


class TightPoolRadixMachine(RadixMachine):
    def __init__(self):
        super().__init__()
        self.pool = BlockPool(TIGHT_BLOCKS, B)
        self.tree = RadixTree(self.pool, clock=self.clock, policy=POLICIES[self.policy]())


TIGHT = settings(max_examples=500, stateful_step_count=100, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow])
TestTightPoolRadixMachine = pytest.mark.timeout(1800)(
    pytest.mark.slow(machine_for("credit", TightPoolRadixMachine).TestCase))
TestTightPoolRadixMachine.settings = TIGHT
TestTightPoolRadixMachineLRU = pytest.mark.timeout(1800)(
    pytest.mark.slow(machine_for("lru", TightPoolRadixMachine).TestCase))
TestTightPoolRadixMachineLRU.settings = TIGHT
