"""The prefix cache never changes an answer on the relatives' layers: Mistral's sliding window,
Qwen3's q/k norms, Gemma 2's windows and soft-caps, Gemma 3's local rope, Phi-3's longrope.

Each random model (tests/test_loader_hf.py's builders) serves a shared system prompt several
windows long, then suffixes that branch from it, one by one and concurrently, in an engine
with the prefix cache and one without: the cached engine reuses the prefix and every greedy
run agrees with the uncached one (docs/ARCHITECTURE.md section 7's near-tie rule), blocks
conserved (both pools, where the window layers have one). Chunked prefill (16 tokens) splits
the prompts at window-crossing points."""
import pytest

from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.model.loader import load_model
from tests.support.engine import engine_config
from tests.support.engine_compare import assert_clean, compare_greedy, generate_all, greedy
from tests.test_loader_hf import write_model_dir

pytest.importorskip("transformers")

VARIANTS = ("mistral-window", "qwen3", "gemma2", "gemma3", "phi3")
SYSTEM = list(range(300, 340))                      # 40 tokens: five windows of 8
SUFFIXES = [list(range(1000 + 7 * k, 1000 + 7 * k + 5 + k)) for k in range(4)]


@pytest.fixture(scope="module", params=VARIANTS)
def loaded(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    write_model_dir(path, request.param)
    return load_model(str(path), device="cpu", weights_dtype="float32", max_model_len=512)


def engine(model, cache: bool) -> Engine:
    """16-token steps over a 512-token context: the window models get a window pool of their
    own (the auto ratio, 2 (W + 16) / 512 of the main one, at least one sequence's need)."""
    return Engine(model, engine_config(num_blocks=64, enable_prefix_cache=cache,
                                       record_logits=True, prefill_chunk=16,
                                       max_step_tokens=16, solo_step_tokens=16,
                                       adapt_threads=False)).start()


def test_greedy_runs_agree_with_and_without_the_cache(loaded):
    cached, plain = engine(loaded, True), engine(loaded, False)
    try:
        prompts = [SYSTEM + s for s in SUFFIXES]
        first = [cached.generate(greedy(p, max_tokens=6)) for p in prompts[:2]]
        together = generate_all(cached, [greedy(p, max_tokens=6) for p in prompts])
        reused = sum(f.usage.cache_read_tokens for f in first[1:] + together)
        assert reused >= 32 * 5                    # the system prompt's two blocks, each time
        for got, prompt in zip(first + together, prompts[:2] + prompts):
            ref = plain.generate(greedy(prompt, max_tokens=6))
            assert ref.usage.cache_read_tokens == 0
            compare_greedy(cached, got, plain, ref, logit_tol=1e-3)
        assert_clean(cached)
        assert_clean(plain)
    finally:
        cached.shutdown(grace_s=0)
        plain.shutdown(grace_s=0)


def hit_rate(path, shape=None) -> float:
    """Cached / prompt tokens over a shared-system-prompt workload (prompt five windows long,
    eight users, two turns each), one request at a time."""
    write_model_dir(path, "gemma2", shape=shape)
    model = load_model(str(path), device="cpu", weights_dtype="float32", max_model_len=512)
    served = engine(model, True)
    assert (served.core.kv.window is not None) == (shape is None)   # a pool of its own
    try:
        read = total = 0
        for turn in range(2):
            for user in range(8):
                prompt = SYSTEM + list(range(2000 + 50 * user, 2000 + 50 * user + 6 * (turn + 1)))
                done = served.generate(greedy(prompt, max_tokens=2))
                read, total = read + done.usage.cache_read_tokens, total + len(prompt)
        assert_clean(served)
        return read / total
    finally:
        served.shutdown(grace_s=0)


def test_window_layers_keep_the_hit_rate_of_an_all_global_model(tmp_path):
    """A Gemma 2 model (window layers) reuses as much of a shared system prompt two windows
    long and more as the same model with every layer global (issue: within 2%)."""
    windowed = hit_rate(tmp_path / "windowed")
    everywhere = hit_rate(tmp_path / "global", shape={"layer_types": ["full_attention"] * 2})
    assert windowed > 0.5 and abs(windowed - everywhere) <= 0.02, (windowed, everywhere)
