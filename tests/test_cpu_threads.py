"""runtime/cpu_threads.py: work run on a fresh thread leaves no torch worker thread behind."""
from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from radixgate.runtime.cpu_threads import run_on_fresh_thread


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
    assert out.stdout.strip() == "1000", out.stderr
    env["GOMP_SPINCOUNT"] = "300000"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "300000", out.stderr
