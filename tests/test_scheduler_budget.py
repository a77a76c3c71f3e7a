"""The step budget: a step in which no sequence decodes takes ``solo_step_tokens`` in
bigger prefill chunks; once a sequence decodes, steps go back to ``max_step_tokens``."""
from radixgate.kv import BlockPool, RadixTree
from radixgate.runtime.engine.api import Request
from radixgate.kv.manager import KVManager
from radixgate.runtime.engine.engine_config import EngineConfig
from radixgate.runtime.engine.scheduler import Scheduler
from radixgate.runtime.engine.sequence import Sequence

from tests.test_admission_walks import NoCopyKV


def _scheduler(**fields) -> Scheduler:
    pool = BlockPool(1024, 16)
    config = EngineConfig(num_blocks=1024, max_step_tokens=512, **fields)
    return Scheduler(config, KVManager(RadixTree(pool), pool, NoCopyKV()))


def _add(scheduler: Scheduler, tokens: list[int], rid: int) -> Sequence:
    seq = Sequence(Request(tokens), arrival=rid)
    scheduler.add(seq)
    return seq


def _computed(plan) -> None:
    """What the engine does after a step: the chunks' tokens are computed; a finished
    prompt is in the tree and its sequence has sampled its first token."""
    for chunk in plan.chunks:
        samples = chunk.samples
        chunk.seq.num_computed += chunk.num_tokens
        if samples:
            chunk.seq.kv.prefill_inserted = True
            chunk.seq.tokens.append(7)


def test_a_prompt_alone_goes_in_solo_sized_chunks():
    scheduler = _scheduler(solo_step_tokens=2048)
    _add(scheduler, list(range(3000)), 0)
    plan = scheduler.schedule()
    assert [c.num_tokens for c in plan.chunks] == [2048]
    _computed(plan)
    assert [c.num_tokens for c in scheduler.schedule().chunks] == [952]


def test_beside_a_decoding_sequence_steps_keep_the_normal_budget():
    scheduler = _scheduler(solo_step_tokens=2048)
    short = _add(scheduler, list(range(100, 120)), 0)
    _computed(scheduler.schedule())
    assert short.kv.prefill_inserted
    _add(scheduler, list(range(3000)), 1)
    plan = scheduler.schedule()
    assert [(c.seq is short, c.num_tokens) for c in plan.chunks] == [(True, 1), (False, 511)]


def test_a_set_prefill_chunk_still_caps_a_solo_step_and_solo_never_shrinks_the_budget():
    scheduler = _scheduler(solo_step_tokens=2048, prefill_chunk=256)
    _add(scheduler, list(range(3000)), 0)
    assert [c.num_tokens for c in scheduler.schedule().chunks] == [256]
    scheduler = _scheduler(solo_step_tokens=100)
    _add(scheduler, list(range(3000)), 0)
    assert [c.num_tokens for c in scheduler.schedule().chunks] == [512]
