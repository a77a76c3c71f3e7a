"""The window layers' own pool in a running engine (docs/ARCHITECTURE.md section 9b).

Tiny random Gemma 2 / Mistral models (8-token windows, 16-token blocks) with a window pool
far smaller than the main one: a sequence runs in about (W + step) / B window blocks however
long it gets, the tree's window data is tombstoned under pressure, and a prefix whose window
data is gone is recomputed from the nearest usable point. Greedy answers equal an engine
without the cache; both pools stay conserved (``debug_integrity`` at every idle)."""
import pytest

from radixgate.kv import DiskTierConfig
from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.model.loader import load_model
from tests.support.engine import engine_config
from tests.support.engine_compare import assert_clean, compare_greedy, generate_all, greedy
from tests.test_loader_hf import write_model_dir

pytest.importorskip("transformers")

SYSTEM = list(range(300, 364))                      # 64 tokens: eight windows of 8
STEP = dict(prefill_chunk=16, max_step_tokens=16, solo_step_tokens=16)
LEAST = 4                                           # ceil((8 + 16) / 16) + 2 window blocks


@pytest.fixture(scope="module", params=("gemma2", "mistral-window"))
def loaded(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    write_model_dir(path, request.param)
    return load_model(str(path), device="cpu", weights_dtype="float32", max_model_len=512)


def engine(model, cache: bool = True, window_blocks: int | None = 6, num_blocks: int = 64,
           **fields) -> Engine:
    config = engine_config(num_blocks=num_blocks, window_blocks=window_blocks,
                           enable_prefix_cache=cache, record_logits=True, adapt_threads=False,
                           debug_integrity=True, **STEP, **fields)
    return Engine(model, config).start()


def window_stats(served: Engine) -> dict:
    return served.core.kv.window.stats()


def test_a_long_sequence_runs_in_a_window_of_blocks(loaded):
    """200 prompt tokens and 40 more generated (15 main blocks) in the smallest window pool
    (4 blocks): the window layers drop what their window has passed."""
    small = engine(loaded, cache=False, window_blocks=LEAST)
    plain = engine(loaded, cache=False, window_blocks=None, window_ratio=1.0)
    try:
        assert small.core.kv.num_window_blocks == LEAST and plain.core.kv.window is None
        prompt = [(11 * i) % 5000 + 100 for i in range(200)]
        got = small.generate(greedy(prompt, max_tokens=40))
        ref = plain.generate(greedy(prompt, max_tokens=40))
        compare_greedy(small, got, plain, ref, logit_tol=1e-4)
        assert_clean(small)
        assert window_stats(small)["free"] == LEAST
    finally:
        small.shutdown(grace_s=0)
        plain.shutdown(grace_s=0)


def test_tombstoned_prefixes_are_recomputed_from_a_usable_point(loaded):
    """A shared system prompt, branches from it, then prompts that leave it half-way (where
    the tree has tombstoned the window data): every answer equals the uncached engine's,
    the reuse backs off below the gap, and the window data of the full prompt's end stays."""
    cached, plain = engine(loaded), engine(loaded, cache=False, window_blocks=None)
    events = []
    cached.core.subscribe_events(events.append)     # (no request yet: the thread is idle)
    try:
        prompts = [SYSTEM + [1000 + 7 * k + j for j in range(5 + k)] for k in range(4)]
        first = [cached.generate(greedy(p, max_tokens=6)) for p in prompts[:2]]
        together = generate_all(cached, [greedy(p, max_tokens=6) for p in prompts])
        assert window_stats(cached)["tombstoned"] > 0
        assert any(e.kind == "window_removed" for e in events)          # KV events see it
        half = [SYSTEM[:29 + 3 * k] + [2000 + k, 2001 + k] for k in range(3)]
        halves = [cached.generate(greedy(p, max_tokens=4)) for p in half]
        asked = [(p, 6) for p in prompts[:2] + prompts] + [(p, 4) for p in half]
        for got, (prompt, max_tokens) in zip(first + together + halves, asked):
            ref = plain.generate(greedy(prompt, max_tokens=max_tokens))
            compare_greedy(cached, got, plain, ref, logit_tol=1e-3)
        reused = [f.usage.cache_read_tokens for f in first[1:] + together]
        assert all(r >= len(SYSTEM) for r in reused), reused
        assert all(h.usage.cache_read_tokens < 29 for h in halves)   # backed off
        assert_clean(cached)
        assert_clean(plain)
    finally:
        cached.shutdown(grace_s=0)
        plain.shutdown(grace_s=0)


def test_pinned_prefixes_keep_their_window_data(loaded):
    """A pinned prefix stays usable whole while other traffic tombstones the rest."""
    from radixgate.runtime.engine.api import Breakpoint
    cached = engine(loaded)
    try:
        cached.generate(greedy(SYSTEM + [5, 6], max_tokens=2,
                               breakpoints=[Breakpoint(len(SYSTEM), 300.0)]))
        for k in range(6):                          # other prompts push the window pool
            cached.generate(greedy([4000 + 50 * k + i for i in range(70)], max_tokens=2))
        again = cached.generate(greedy(SYSTEM + [7, 8], max_tokens=2))
        assert again.usage.cache_read_tokens == len(SYSTEM)
        assert window_stats(cached)["tombstoned"] > 0
        assert_clean(cached)
    finally:
        cached.shutdown(grace_s=0)


def test_the_disk_tier_keeps_window_data_and_tombstones_apart(loaded, tmp_path):
    """A 200-token prompt goes to the disk tier (its early blocks tombstoned for the window
    layers: stored without their K/V) and comes back: the whole prompt reuses its end's
    window data from disk; a prompt leaving it half-way backs off to the nearest point
    whose window the records hold (here: 0). Answers equal the uncached engine's."""
    served = engine(loaded, window_blocks=12, num_blocks=24,
                    disk=DiskTierConfig(str(tmp_path), 0.01))
    plain = engine(loaded, cache=False, window_blocks=None)
    try:
        prompt = [(13 * i) % 3000 + 200 for i in range(200)]
        half = prompt[:100] + [7, 8, 9]
        served.generate(greedy(prompt, max_tokens=2))
        for k in range(3):                                  # push it out of memory
            served.generate(greedy([5000 + 200 * k + i for i in range(180)], max_tokens=2))
        wait_written(served)
        again = served.generate(greedy(half, max_tokens=4))      # from disk: back-off
        back = served.generate(greedy(prompt, max_tokens=4))
        snap = served.request_snapshot().result(timeout=30)
        assert snap.hit_tokens["disk"] >= 100, snap.hit_tokens
        assert back.usage.cache_read_tokens == len(prompt) - 1
        assert again.usage.cache_read_tokens < 100          # records 0..5 lack window data
        for got, tokens in ((back, prompt), (again, half)):
            ref = plain.generate(greedy(tokens, max_tokens=4))
            compare_greedy(served, got, plain, ref, logit_tol=1e-3)
        assert_clean(served)
    finally:
        served.shutdown(grace_s=0)
        plain.shutdown(grace_s=0)


def wait_written(served: Engine, timeout: float = 30) -> None:
    import time
    stop = time.monotonic() + timeout
    while served.request_snapshot().result(timeout=30).tier.staged_bytes and \
            time.monotonic() < stop:
        time.sleep(0.02)
