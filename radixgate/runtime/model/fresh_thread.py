"""The model is built on a thread of its own that ends when the build does, so that the
OpenMP worker pool that thread's torch work creates ends with it and the engine thread is
the only holder of a multi-thread pool (why that matters: radixgate/runtime/engine/cpu_threads.py)."""
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
