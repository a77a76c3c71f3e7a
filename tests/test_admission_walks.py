"""Admission walks the tree once per waiting candidate (and namespace searched): the
longest-prefix-first order, the fit check and the match reuse one ``RadixTree.probe`` for
the scheduling pass (was: a peek per candidate per admission, then a walk for the fit check
and one for the match)."""
import pytest

from radixgate.kv import BlockPool, RadixTree
from radixgate.runtime.engine.api import Request
from radixgate.kv.manager import KVManager
from radixgate.runtime.engine.engine_config import EngineConfig
from radixgate.runtime.engine.scheduler import CANDIDATE_WINDOW, Scheduler
from radixgate.runtime.engine.sequence import Sequence


class NoCopyKV:
    def copy_blocks(self, pairs, valid_slots):
        pass


def scheduler_with_waiting(use_public: bool, max_num_seqs: int = 4):
    pool = BlockPool(4096, 16)
    tree = RadixTree(pool)
    for namespace in ("ns", "public"):
        blocks = pool.allocate(8)
        tree.insert(namespace, list(range(100)), blocks)
        pool.decref_many(blocks)
    scheduler = Scheduler(EngineConfig(num_blocks=4096, max_num_seqs=max_num_seqs,
                                       max_step_tokens=100_000),
                          KVManager(tree, pool, NoCopyKV()))
    for i in range(CANDIDATE_WINDOW):
        tokens = list(range(50 + i)) + [1000 + i] * 16        # each splits the cached prompt
        scheduler.add(Sequence(Request(tokens, namespace="ns", use_public=use_public),
                               arrival=i))
    return tree, scheduler


@pytest.mark.parametrize("use_public, namespaces", [(False, 1), (True, 2)])
def test_one_walk_per_candidate_and_namespace_per_scheduling_pass(use_public, namespaces):
    tree, scheduler = scheduler_with_waiting(use_public)
    walks = [0]
    walk = tree._walk

    def counting(*args):
        walks[0] += 1
        return walk(*args)

    tree._walk = counting
    plan = scheduler.schedule()
    assert len(plan.chunks) == 4 and not plan.failed
    # longest cached prefix first: the four longest prompts were admitted
    assert sorted(len(c.seq.tokens) for c in plan.chunks) == [78, 79, 80, 81]
    assert walks[0] == CANDIDATE_WINDOW * namespaces
    for chunk in plan.chunks:
        assert chunk.seq.num_computed == len(chunk.seq.tokens) - 16   # reused its prefix
