"""Batch work (``Request.priority = BATCH_PRIORITY``) runs below interactive requests: an
interactive request is admitted before waiting batch requests, and when memory is short a
running batch request gives way (preempted, resumed later with the same answer)."""
from __future__ import annotations

import itertools
import threading

from radixgate.runtime.engine.api import BATCH_PRIORITY, Finished, Request, SamplingParams, TextDelta
from radixgate.runtime.engine.engine import Engine
from tests.support.engine import engine_config, tiny_model


def request(tokens, priority: int, max_tokens: int = 8) -> Request:
    return Request(list(tokens), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                ignore_eos=True),
                   tenant="acme", namespace="ns-acme", priority=priority)


class Order:
    """The order in which requests saw their first token."""

    def __init__(self):
        self.counter = itertools.count()
        self.first: dict[str, int] = {}
        self.lock = threading.Lock()

    def sink(self, name: str):
        def on_event(event):
            if isinstance(event, (TextDelta, Finished)):
                with self.lock:
                    self.first.setdefault(name, next(self.counter))
        return on_event


def test_an_interactive_request_goes_before_waiting_batch_work():
    engine = Engine(tiny_model(), engine_config(num_blocks=128, max_num_seqs=2,
                                                adapt_threads=False)).start()
    order = Order()
    try:
        futures = [engine.submit_future(request(range(100 + 40 * i, 130 + 40 * i), BATCH_PRIORITY),
                                        order.sink(f"batch-{i}")) for i in range(10)]
        while not order.first:                      # batch work is running
            threading.Event().wait(0.005)
        mine = engine.submit_future(request(range(5000, 5030), 0), order.sink("interactive"))
        assert mine.result(timeout=120).reason.value == "length"
        for future in futures:
            assert future.result(timeout=120).reason.value == "length"
    finally:
        engine.shutdown(grace_s=0)
    later = [name for name, at in order.first.items()
             if name.startswith("batch") and at > order.first["interactive"]]
    assert len(later) >= 6, order.first            # it went ahead of the batch queue


def test_a_running_batch_request_gives_way_when_memory_is_short():
    """Memory for about two requests: batch work fills it, an interactive request arrives;
    a batch request is preempted, and every answer equals the one computed alone."""
    prompts = [list(range(200 + 64 * i, 200 + 64 * i + 60)) for i in range(4)]
    alone = Engine(tiny_model(), engine_config(num_blocks=64, adapt_threads=False)).start()
    try:
        expected = [alone.generate(request(p, 0, 24)).output_token_ids for p in prompts]
    finally:
        alone.shutdown(grace_s=0)
    engine = Engine(tiny_model(), engine_config(num_blocks=13, adapt_threads=False,
                                                enable_prefix_cache=True)).start()
    finished: list[str] = []
    try:
        batch = [engine.submit_future(request(p, BATCH_PRIORITY, 24),
                                      lambda e, i=i: finished.append(f"batch-{i}")
                                      if isinstance(e, Finished) else None)
                 for i, p in enumerate(prompts[:3])]
        while engine.request_snapshot().result(timeout=30).running < 2:
            threading.Event().wait(0.005)
        interactive = engine.generate(request(prompts[3], 0, 24), timeout=120)
        finished.append("interactive")
        answers = [f.result(timeout=120).output_token_ids for f in batch]
        snap = engine.request_snapshot().result(timeout=30)
    finally:
        engine.shutdown(grace_s=0)
    assert interactive.output_token_ids == expected[3]
    assert answers == expected[:3]
    assert snap.preemptions >= 1
    assert finished.index("interactive") < 2, finished    # it did not wait for the batch
