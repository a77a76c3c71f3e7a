"""Where torch's CPU work runs, so that its OpenMP worker threads spin-wait instead of sleeping.

torch's CPU build runs its intra-op parallelism on libgomp, which keeps one pool of worker
threads per thread that ever ran a parallel region, for as long as that thread lives. Between
regions a worker spin-waits for the next one, unless libgomp counts more live worker threads
(every pool's, plus the first thread) than the process has CPUs: then it spins about 100 times
and sleeps on a futex, and every later region pays a wake-up. A decode step is ~200 small
parallel regions, so one extra pool (the thread that loaded the model, kept by asyncio's
executor) made the engine thread's single-stream decode 1.7x slower here (2 threads on 2
CPUs: 66 against 116 tok/s; the int4 matmul at one row 67 against 23 us).

So the model is built on a thread of its own that ends when the build does (its pool goes
with it: ``run_on_fresh_thread`` in radixgate/runtime/model/fresh_thread.py), and the engine thread sets its own thread count
(``torch.set_num_threads`` is per thread); the engine thread is then the only holder of a multi-thread pool. Threads
that run torch work outside the engine (request preparation) stay below the parallel grain.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)


def set_cpu_threads(n: int) -> int:
    """Torch's intra-op CPU thread count for the whole process (every thread, the engine's
    included); ``n <= 0`` leaves torch's default. Returns the count now in effect.

    On a busy shared machine fewer threads than cores is often much faster (threads that
    wait for a core stall every parallel op); on an idle one, torch's default wins."""
    if n > 0:
        torch.set_num_threads(n)
    return torch.get_num_threads()


class OtherCpuLoad:
    """How many of this process's CPUs other processes kept busy since the last ``sample``:
    the busy time of those CPUs in ``/proc/stat`` (steal included: a hypervisor's other
    guests) less this process's own CPU time. None where ``/proc/stat`` cannot be read."""

    def __init__(self, stat_path: str = "/proc/stat", clock: Callable[[], float] = time.monotonic,
                 own_cpu: Callable[[], float] = time.process_time):
        self.stat_path, self.clock, self.own_cpu = stat_path, clock, own_cpu
        self.cpus = {f"cpu{n}" for n in _affinity()}
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.last = self._read()

    def _busy_s(self) -> float | None:
        try:
            with open(self.stat_path) as stat:
                lines = stat.read().splitlines()
        except OSError:
            return None
        busy = 0
        for line in lines:
            name, _, rest = line.partition(" ")
            if name in self.cpus:
                fields = [int(v) for v in rest.split()]
                busy += sum(fields[:8]) - fields[3] - fields[4]     # all but idle, iowait
        return busy / self.tick

    def _read(self) -> tuple[float, float | None, float]:
        return self.clock(), self._busy_s(), self.own_cpu()

    def sample(self) -> float | None:
        """CPUs' worth of other processes' work since the previous sample (0 .. cpus)."""
        now = self._read()
        (t0, busy0, own0), (t1, busy1, own1) = self.last, now
        self.last = now
        if busy0 is None or busy1 is None or t1 <= t0:
            return None
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0)


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


class ThreadGovernor:
    """The engine thread's torch thread count: ``threads`` while the CPUs it needs are
    free, 1 while other processes keep more than ``busy_above`` of a CPU busy beyond the
    ones ``threads`` leaves spare (the process's CPUs less ``threads``).

    A many-thread parallel region ends in a barrier: when another process holds one of the
    cores, the worker waits there for a thread that is not running, and a decode step (~150
    regions) slows down several times (SmolLM2, 2 threads, one core held by a busy loop:
    31-38 tok/s; 1 thread: 86-92; idle cores, 2 threads: 111-117). Checked every
    ``window_s`` between steps (a read of ``/proc/stat``); back to ``threads`` once the others
    stayed under ``idle_below`` (beyond the spare CPUs) for two windows in a row. While on one
    thread the windows are ``recover_window_s`` long: with a busy loop stopped just before 16
    streams arrived, two threads were back 0.14 s after work resumed (0.6-0.9 s with 0.3 s
    windows throughout)."""

    def __init__(self, threads: int, load: OtherCpuLoad | None = None, window_s: float = 0.3,
                 busy_above: float = 0.35, idle_below: float = 0.15,
                 set_threads: Callable[[int], None] = torch.set_num_threads, adapt: bool = True,
                 recover_window_s: float = 0.1):
        self.threads, self.window_s, self.recover_window_s = threads, window_s, recover_window_s
        self.busy_above, self.idle_below = busy_above, idle_below
        self.set_threads = set_threads
        if not adapt or threads <= 1:
            load = None
        elif load is None:
            load = OtherCpuLoad()
        self.load = load
        self.spare = max(0, len(load.cpus) - threads) if load is not None else 0
        self.current, self.quiet_windows, self.switches = threads, 0, 0
        self.next_check = self.load.clock() + window_s if self.load else float("inf")

    def tick(self) -> int:
        """Between steps: the thread count to run the next step with (applied)."""
        if self.load is None or self.load.clock() < self.next_check:
            return self.current
        other = self.load.sample()
        if other is None:
            self.next_check = self.load.clock() + self.window_s
            return self.current
        other -= self.spare
        if other > self.busy_above:
            self.quiet_windows = 0
            self._use(1, other)
        elif other < self.idle_below:
            self.quiet_windows += 1
            if self.quiet_windows >= 2:
                self._use(self.threads, other)
        else:
            self.quiet_windows = 0
        window = self.window_s if self.current == self.threads else self.recover_window_s
        self.next_check = self.load.clock() + window
        return self.current

    def _use(self, threads: int, other: float) -> None:
        if threads != self.current:
            log.info("engine torch threads %d -> %d: other processes keep %.2f CPUs busy",
                     self.current, threads, other + self.spare)
            self.set_threads(threads)
            self.current = threads
            self.switches += 1
