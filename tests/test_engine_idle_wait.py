"""The runtime loop: an engine whose waiting requests cannot start blocks on its
command queue until something can change that (a command, a deadline, a pin's expiry),
never polling; snapshots count block states from kept counters, not by walking the cache."""
from __future__ import annotations

import threading
import time

from radixgate.runtime.engine.api import ErrorKind, FinishReason, TextDelta
from radixgate.runtime.engine.engine_config import TenantQuota
from tests.support.engine_compare import greedy, held


class Gate:
    """A tenant quota the test opens and closes: closed, tenant ``held`` may run nothing,
    so its requests wait with nothing running (the engine cannot start them)."""

    def __init__(self):
        self.closed = True

    def __call__(self, tenant: str) -> TenantQuota:
        return TenantQuota(max_running=0 if self.closed and tenant == "held" else None)


def count_steps(engine) -> list[int]:
    """Counts the engine's steps (the engine thread looks ``core.step`` up each time)."""
    calls, step = [0], engine.core.step

    def counted():
        calls[0] += 1
        return step()

    engine.core.step = counted
    return calls


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_waiting_request_that_cannot_start_does_not_spin_the_engine(make_engine):
    engine = make_engine(tenant_quotas=Gate())
    steps = count_steps(engine)
    future = engine.submit_future(greedy(range(100, 120), tenant="held"))
    wait_until(lambda: engine.core.counters.stalls >= 1)
    before = steps[0]
    time.sleep(1.0)
    assert steps[0] - before <= 1          # was one step every 50 ms: about 20
    assert engine.core.counters.stalls <= 2
    assert not future.done() and engine.snapshot().waiting == 1


def test_a_stalled_engine_starts_the_request_as_soon_as_a_command_frees_room(make_engine):
    gate = Gate()
    engine = make_engine(tenant_quotas=gate)
    first_token = threading.Event()
    future = engine.submit_future(greedy(range(100, 120), tenant="held"),
                                  on_event=lambda e: isinstance(e, TextDelta) and first_token.set())
    wait_until(lambda: engine.core.counters.stalls >= 1)
    gate.closed = False
    woken = time.monotonic()
    assert engine.abort("no-such-request").result(timeout=30) is False   # any command wakes it
    assert first_token.wait(30)
    assert time.monotonic() - woken < 1.0
    assert future.result(timeout=60).reason is FinishReason.LENGTH


def test_an_abort_of_the_running_request_admits_the_waiting_one_promptly(make_engine):
    engine = make_engine(tenant_quotas={"acme": TenantQuota(max_running=1)})
    started = threading.Event()
    long = greedy(range(100, 120), max_tokens=500, tenant="acme")
    waiting_started = threading.Event()
    engine.submit_future(long, on_event=lambda e: started.set())
    assert started.wait(30)
    waiting = engine.submit_future(greedy(range(300, 320), tenant="acme"),
                                   on_event=lambda e: waiting_started.set())
    time.sleep(0.2)
    assert not waiting_started.is_set()           # its tenant's one slot is taken
    aborted = time.monotonic()
    assert engine.abort(long.request_id).result(timeout=30) is True
    assert waiting_started.wait(30) and time.monotonic() - aborted < 1.0
    assert waiting.result(timeout=60).reason is FinishReason.LENGTH


def test_a_stalled_engine_wakes_at_a_waiting_requests_deadline(make_engine):
    engine = make_engine(tenant_quotas=Gate())
    steps = count_steps(engine)
    submitted = time.monotonic()
    finished = engine.submit_future(greedy(range(100, 120), tenant="held",
                                           deadline=submitted + 0.5)).result(timeout=30)
    elapsed = time.monotonic() - submitted
    assert finished.error_kind is ErrorKind.TIMEOUT
    assert 0.45 <= elapsed < 2.0
    assert steps[0] <= 3


def test_next_wake_is_the_soonest_deadline_or_pin_expiry(make_engine):
    engine = make_engine(tenant_quotas=Gate())
    prompt = greedy(range(100, 140), namespace="ns")
    engine.generate(prompt)
    next_wake = lambda: engine._command(engine.core.next_wake).result(timeout=30)  # noqa: E731
    assert next_wake() is None                      # nothing waits, nothing pinned
    now = time.monotonic()
    assert engine.pin("ns", prompt.tokens, ttl_s=60).result(timeout=30) > 0
    assert now + 59 < next_wake() < time.monotonic() + 61
    engine.submit_future(greedy(range(100, 120), tenant="held", deadline=now + 30))
    assert now + 29 < next_wake() <= now + 30


def test_a_request_behind_one_that_can_never_fit_starts_without_a_stall(make_engine):
    engine = make_engine(num_blocks=8, max_model_len=1024)     # 128 tokens of KV
    pinned = greedy(range(500, 540), max_tokens=4, namespace="ns")
    engine.generate(pinned)
    with held(engine):        # applied in order: U passes the submit check, then the pin
        too_long = engine.submit_future(greedy(range(100, 200), max_tokens=4))
        assert engine.pin("ns", pinned.tokens, ttl_s=60)
        fits = engine.submit_future(greedy(range(300, 310), max_tokens=4))
    assert too_long.result(timeout=60).error_kind is ErrorKind.TOO_LONG     # plan.unfit
    assert fits.result(timeout=60).reason is FinishReason.LENGTH
    assert engine.core.counters.stalls == 0       # was a 50 ms sleep after the unfit one


def test_snapshot_block_counts_match_a_recount_of_the_block_sets(make_engine):
    engine = make_engine()
    shared, other = list(range(100, 160)), list(range(600, 650))
    engine.generate(greedy(shared, namespace="ns"))
    engine.generate(greedy(other, namespace="ns2"))
    assert engine.pin("ns", shared, ttl_s=60).result(timeout=30) > 0
    assert engine.pin("ns2", other, ttl_s=60).result(timeout=30) > 0
    started = threading.Event()
    engine.submit_future(greedy(shared + [7, 8, 9], max_tokens=400, namespace="ns"),
                         on_event=lambda e: started.set())
    assert started.wait(30)

    def both():
        core = engine.core
        in_use = {b for seq in core.scheduler.running for b in seq.kv.block_table}
        pinned = core.tree.pinned_blocks() - in_use
        cached = core.tree.held_blocks() - in_use - pinned
        return core.snapshot().blocks, (len(cached), len(pinned), len(in_use))

    blocks, (cached, pinned, in_use) = engine._command(both).result(timeout=30)
    assert (blocks.cached, blocks.pinned, blocks.in_use) == (cached, pinned, in_use)
    assert in_use > 0 and pinned > 0 and cached > 0 and blocks.total == 128
