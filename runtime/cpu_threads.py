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
with it: ``run_on_fresh_thread``), and the engine thread sets its own thread count
(``torch.set_num_threads`` is per thread); the engine thread is then the only holder of a multi-thread pool. Threads
that run torch work outside the engine (request preparation) stay below the parallel grain.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def run_on_fresh_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` on a new thread with the caller's torch thread count, joined;
    returns its result or raises its exception. The thread's OpenMP pool ends with it."""
    threads = torch.get_num_threads()
    outcome: dict = {}

    def target() -> None:
        torch.set_num_threads(threads)
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="radixgate-build", daemon=True)
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
