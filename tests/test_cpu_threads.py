"""radixgate/runtime/engine/cpu_threads.py and radixgate/runtime/model/fresh_thread.py: work run on a fresh thread leaves no torch worker thread behind."""
from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from radixgate.runtime.engine.cpu_threads import OtherCpuLoad, ThreadGovernor
from radixgate.runtime.model.fresh_thread import run_on_fresh_thread


def _os_threads(at_most: int | None = None) -> int:
    """The process's OS threads once the count has held for 0.2 s (ended workers leave
    asynchronously); with ``at_most``, also waits for it to drop to that. At most 3 s."""
    deadline = time.monotonic() + 3.0
    count, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = len(os.listdir("/proc/self/task"))
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since >= 0.2 and (at_most is None or count <= at_most):
            break
        time.sleep(0.01)
    return count


def _parallel_sum() -> float:
    return float(torch.ones(4_000_000).sum())         # far above the parallel grain


def _threads_left_by(run, wait: bool) -> int:
    """OS threads added while a long-lived thread (2 torch threads) runs ``run`` once
    (``wait``: give ending threads up to 2 s to leave)."""
    result: dict = {}

    def body() -> None:
        torch.set_num_threads(2)
        before = _os_threads()
        result["value"] = run(_parallel_sum)
        result["added"] = _os_threads(at_most=before if wait else None) - before

    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert result["value"] == 4_000_000
    return result["added"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc")
def test_fresh_thread_takes_its_worker_threads_with_it():
    assert _threads_left_by(run_on_fresh_thread, wait=True) == 0
    assert _threads_left_by(lambda fn: fn(), wait=False) >= 1            # run in place: a pool stays


def test_fresh_thread_returns_and_raises():
    assert run_on_fresh_thread(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(ValueError, match="boom"):
        run_on_fresh_thread(lambda: (_ for _ in ()).throw(ValueError("boom")))


def test_importing_radixgate_bounds_the_openmp_spin_unless_the_user_set_it():
    """libgomp reads GOMP_SPINCOUNT when torch loads: radixgate sets it before any torch import
    (its default spin collapses decode when another process holds a core)."""
    import os
    import subprocess
    import sys

    code = "import radixgate.runtime, os; print(os.environ['GOMP_SPINCOUNT'])"
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "30000", out.stderr
    env["GOMP_SPINCOUNT"] = "300000"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "300000", out.stderr


class FakeLoad:
    """Other processes' load per window, on a clock the test moves."""

    def __init__(self, loads, cpus: int = 2):
        self.loads, self.now = list(loads), 0.0
        self.cpus = {f"cpu{n}" for n in range(cpus)}

    def clock(self) -> float:
        return self.now

    def sample(self):
        return self.loads.pop(0)


def test_the_governor_drops_to_one_thread_while_others_are_busy_and_comes_back_when_quiet():
    load = FakeLoad([0.0, 0.9, 0.2, 0.1, 0.05, 0.6, None])
    calls: list[int] = []
    governor = ThreadGovernor(2, load=load, window_s=0.3, set_threads=calls.append)
    seen = []
    for _ in range(7):
        assert governor.tick() == governor.current        # within the window: no sample
        load.now += 0.3
        seen.append(governor.tick())
    # quiet, busy -> 1, in between (stays), quiet once (stays), twice -> 2, busy -> 1, unreadable
    assert seen == [2, 1, 1, 1, 2, 1, 1]
    assert calls == [1, 2, 1] and governor.switches == 3


def test_on_one_thread_the_governor_checks_in_short_windows_so_a_freed_core_comes_back_fast():
    load = FakeLoad([0.9, 0.05, 0.05, 0.9])
    governor = ThreadGovernor(2, load=load, window_s=0.3, recover_window_s=0.1,
                              set_threads=lambda n: None)
    load.now = 0.3
    assert governor.tick() == 1                            # busy: one thread
    seen = []
    for _ in range(2):
        load.now += 0.1                                    # a recovery window, not a full one
        seen.append(governor.tick())
    assert seen == [1, 2]                                  # two quiet short windows: back
    load.now += 0.1
    assert governor.tick() == 2 and len(load.loads) == 1   # back on full windows: no sample yet


def test_others_on_cpus_the_engine_leaves_spare_do_not_count():
    load = FakeLoad([2.2, 2.1, 2.1, 3.0], cpus=4)          # 2 threads on 4 CPUs: 2 spare
    governor = ThreadGovernor(2, load=load, window_s=0.3, set_threads=lambda n: None)
    seen = []
    for _ in range(4):
        load.now += 0.3
        seen.append(governor.tick())
    assert seen == [2, 2, 2, 1]


def test_a_fixed_or_single_thread_engine_never_switches():
    for governor in (ThreadGovernor(2, load=FakeLoad([0.9]), adapt=False),
                     ThreadGovernor(1, load=FakeLoad([0.9]))):
        assert governor.load is None and governor.tick() == governor.current


def test_other_cpu_load_is_the_cpus_busy_time_less_our_own(tmp_path):
    stat = tmp_path / "stat"
    ticks = os.sysconf("SC_CLK_TCK")

    def write(busy_ticks: int, idle_ticks: int) -> None:
        cpus = "".join(f"cpu{n} {busy_ticks} 0 0 {idle_ticks} 0 0 0 0 0 0\n"
                       for n in sorted(os.sched_getaffinity(0)))
        stat.write_text("cpu 0 0 0 0 0 0 0 0 0 0\n" + cpus)

    clock, own = [0.0], [0.0]
    write(0, 0)
    load = OtherCpuLoad(str(stat), clock=lambda: clock[0], own_cpu=lambda: own[0])
    cpus = len(os.sched_getaffinity(0))
    write(ticks, 0)                       # every CPU busy for 1 s of a 1 s window...
    clock[0], own[0] = 1.0, 0.5           # ...of which 0.5 s was this process
    assert load.sample() == pytest.approx(cpus - 0.5)
    stat.unlink()
    clock[0] = 2.0
    assert load.sample() is None
