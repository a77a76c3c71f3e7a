"""Window layers at their real size: Gemma 2's attention geometry (8 heads of 256, 4 kv heads,
a 4,096-token window, soft-capped scores) in a two-layer random model, KV in float32 at 16
tokens a block. A shared prefix longer than the window is served with the prefix cache (the
window layers in a pool of their own, 400 blocks beside 700: the smallest that holds one
sequence's window and a 2,048-token step) and without: greedy answers agree while the window
slides past the cached part (the tiny tests' 8-token window hides block counts, gathers and
score sizes of this scale)."""
import pytest

from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.model.loader import load_model
from tests.support.engine import engine_config
from tests.support.engine_compare import assert_clean, compare_greedy, greedy
from tests.test_loader_hf import write_model_dir

pytest.importorskip("transformers")

REAL = dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
            query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0, intermediate_size=512, max_position_embeddings=8192)
PREFIX = [(7 * i) % 40000 + 300 for i in range(4200)]


def test_a_prefix_past_the_real_window_is_reused_exactly(tmp_path):
    write_model_dir(tmp_path, "gemma2", shape=REAL)
    model = load_model(str(tmp_path), device="cpu", weights_dtype="float32", max_model_len=8192)
    assert model.config.layer_windows == (4096, 0)
    engines = [Engine(model, engine_config(num_blocks=700, enable_prefix_cache=cache,
                                           window_blocks=400 if cache else None,
                                           record_logits=True, adapt_threads=False)).start()
               for cache in (True, False)]
    cached, plain = engines
    try:
        assert cached.core.kv.num_window_blocks == 400 and plain.core.kv.window is None
        cached.generate(greedy(PREFIX + [11, 12, 13], max_tokens=1), timeout=600)
        prompt = PREFIX + [21, 22, 23, 24, 25]
        got = cached.generate(greedy(prompt, max_tokens=3), timeout=600)
        assert got.usage.cache_read_tokens >= 4192               # the prefix, read back
        ref = plain.generate(greedy(prompt, max_tokens=3), timeout=600)
        compare_greedy(cached, got, plain, ref, logit_tol=5e-5)    # float32: rounding only
        counts = assert_clean(cached)
        assert counts["window"]["cached_blocks"] >= 4096 // 16     # the prefix's end, kept
    finally:
        for engine in engines:
            engine.shutdown(grace_s=0)
