"""KV dtypes and the lazy KV pool: capacity per dtype, 8-bit quantization on write and
dequantization on read, copy-on-write copying scales, greedy answers with and without the
prefix cache equal for every dtype, and an allocated pool that stays out of memory until used."""
from types import SimpleNamespace

import pytest
import torch

from radixgate.kernels import copy_blocks, dequantize_kv, paged_attention, quantize_kv, store_kv
from radixgate.kernels.testing import make_paged_case
from radixgate.kv import CacheConfig
from radixgate.kv.dtypes import KV_DTYPE_BYTES, KV_DTYPES, KV_SCALE_BYTES, kv_bytes_per_token
from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.engine.engine_config import EngineConfig
from radixgate.runtime.model.kv_cache import KVCache, resolve_kv_dtype
from radixgate.runtime.model.kv_dtypes import KV_TORCH_DTYPES, SCALE_DTYPE
from radixgate.runtime.model.model_config import ModelConfig
from radixgate.runtime.model.planner import plan
from tests.support.engine import tiny_model
from tests.support.engine_compare import assert_clean, compare_greedy, greedy

DTYPES = list(KV_DTYPE_BYTES)
SMOLLM2 = SimpleNamespace(num_layers=30, num_kv_heads=3, head_dim=64)
# cache on vs off: max |logit diff| allowed before a near tie (both runs store the same K/V,
# up to the rounding of matmuls over other row counts, which can flip a code)
LOGIT_TOL = {"float32": 1e-3, "bfloat16": 2e-2, "float16": 1e-2, "int8": 5e-2, "fp8": 1e-1}


def test_eight_bit_dtypes_hold_over_3_5x_the_blocks_of_float32():
    budget = 1 << 30
    blocks = {d: KVCache.blocks_for_budget(budget, 30, 3, 64, 16, d) for d in DTYPES}
    assert blocks["bfloat16"] == blocks["float16"] == 2 * blocks["float32"]
    assert blocks["int8"] == blocks["fp8"] >= 3.5 * blocks["float32"]
    assert plan(SMOLLM2, 1, 1, kv_dtype="int8").bytes_per_token == 2 * 30 * 3 * (64 + 2)
    kv = KVCache.from_budget(SMOLLM2, 64 << 20, 16, "int8")
    assert kv.nbytes <= 64 << 20 and kv.num_blocks == KVCache.blocks_for_budget(64 << 20, 30, 3, 64, 16, "int8")
    assert kv.k[0].dtype == torch.int8 and kv.k_scale[0].shape == (kv.num_blocks, 16, 3)


def test_one_list_of_kv_dtypes_with_their_torch_dtypes_and_sizes():
    assert KV_DTYPES == ("auto", *DTYPES) and DTYPES == ["float32", "bfloat16", "float16", "int8", "fp8"]
    assert {d: KV_TORCH_DTYPES[d].itemsize for d in DTYPES} == KV_DTYPE_BYTES
    assert SCALE_DTYPE.itemsize == KV_SCALE_BYTES
    for name in KV_DTYPES:
        assert CacheConfig(kv_dtype=name).kv_dtype == name
    with pytest.raises(ValueError, match="kv_dtype"):
        CacheConfig(kv_dtype="int4")


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_one_bytes_per_token_formula_matches_the_allocated_pool(kv_dtype):
    """The formula (kv.dtypes) that the model config, the planner, the budget
    split and the snapshot use is what a pool of that dtype really allocates, scales included."""
    config = ModelConfig(vocab_size=8, hidden_size=16, intermediate_size=32, num_layers=2,
                         num_heads=3, num_kv_heads=3, head_dim=8)
    kv = KVCache(2, 3, 4, 3, 8, kv_dtype)
    per_token = kv_bytes_per_token(2, 3, 8, kv_dtype)
    assert kv.nbytes == per_token * kv.num_tokens == kv.bytes_per_token * kv.num_tokens
    assert config.kv_bytes_per_token(kv_dtype) == plan(config, 1, 1, kv_dtype=kv_dtype).bytes_per_token == per_token
    assert KVCache.blocks_for_budget(per_token * 4 * 5, 2, 3, 8, 4, kv_dtype) == 5
    with pytest.raises(ValueError, match="kv dtype"):
        kv_bytes_per_token(2, 3, 8, "int4")


def test_auto_is_the_model_dtype():
    assert resolve_kv_dtype("auto", torch.float32, "cpu") == "float32"
    assert resolve_kv_dtype("auto", torch.float16, "cpu") == "float16"
    assert resolve_kv_dtype("auto", torch.float32, "meta") == "float32"
    assert resolve_kv_dtype("int8", torch.float32, "cpu") == "int8"


@pytest.mark.parametrize("dtype, rel", [(torch.int8, 0.005), (torch.float8_e4m3fn, 0.07)])
def test_quantize_then_dequantize_stays_within_one_code_per_head(dtype, rel):
    x = torch.randn(50, 3, 64) * torch.rand(50, 3, 1) * 20
    codes, scale = quantize_kv(x, dtype)
    assert codes.dtype == dtype and scale.dtype == torch.float16 and scale.shape == (50, 3)
    err = (dequantize_kv(codes, scale, torch.float32) - x).abs().amax(-1)
    assert bool((err <= rel * x.abs().amax(-1) + 1e-6).all())
    zero_codes, zero_scale = quantize_kv(torch.zeros(2, 3, 64), dtype)
    assert bool((dequantize_kv(zero_codes, zero_scale, torch.float32) == 0).all())


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
def test_eight_bit_store_and_attention_follow_float32(kv_dtype):
    case = make_paged_case([1, 9, 1], [17, 30, 5], num_heads=6, num_kv_heads=2, head_dim=64,
                           block_size=16, fill=0.0)
    kv = KVCache(1, case.k_cache.shape[0], 16, 2, 64, kv_dtype)
    for i, (key, value) in enumerate(zip(case.keys, case.values)):  # every position, paged
        table = case.block_tables[i]
        slots = torch.arange(len(key))
        slots = table[slots // 16].long() * 16 + slots % 16
        store_kv(key, value, kv.k[0], kv.v[0], slots, **kv.layer_scales(0))
    got = paged_attention(case.q, kv.k[0], kv.v[0], case.block_tables, case.cu_q_lens,
                          case.seq_lens, 0.125, **kv.layer_scales(0))
    full = paged_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_q_lens,
                           case.seq_lens, 0.125)
    assert got.dtype == torch.float32
    assert (got - full).abs().max() < (0.02 if kv_dtype == "int8" else 0.1) * full.abs().max()


def test_copy_on_write_copies_the_scales_of_an_eight_bit_cache():
    kv = KVCache(2, 8, 4, 2, 16, "int8")
    for layer in range(2):
        store_kv(torch.randn(32, 2, 16), torch.randn(32, 2, 16), kv.k[layer], kv.v[layer],
                 torch.arange(32), **kv.layer_scales(layer))
    before = [t.clone() for t in kv.k + kv.v + kv.k_scale + kv.v_scale]
    kv.copy_blocks(torch.tensor([[2, 5]]), torch.tensor([3], dtype=torch.int32))
    for cache, old in zip(kv.k + kv.v + kv.k_scale + kv.v_scale, before):
        assert torch.equal(cache[5, :3], old[2, :3]) and torch.equal(cache[5, 3:], old[5, 3:])
        assert torch.equal(cache[:5], old[:5])
    with pytest.raises(ValueError, match="needs k_scale"):
        copy_blocks(kv.k[0], kv.v[0], torch.tensor([[1, 6]]), torch.tensor([1], dtype=torch.int32))


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def test_a_large_pool_takes_memory_only_for_the_blocks_written():
    before = _rss_bytes()
    kv = KVCache.from_budget(SMOLLM2, 1 << 30, 16, "float32")      # 1 GiB of KV, lazily
    allocated = _rss_bytes() - before
    for layer in range(kv.num_layers):                              # write 4 blocks per layer
        kv.k[layer][:4] = 1.0
        kv.v[layer][:4] = 1.0
    written = _rss_bytes() - before
    assert kv.nbytes > 1000 << 20 and allocated < 16 << 20, allocated
    assert written < 64 << 20 and float(kv.k[3][5].abs().sum()) == 0.0


def _engine(kv_dtype: str, prefix_cache: bool, loaded=None, num_blocks: int = 96) -> Engine:
    cache = CacheConfig(kv_dtype=kv_dtype, block_size=4, enable_prefix_cache=prefix_cache)
    # a fixed thread count: another one sums matmuls in another order, and an 8-bit cache
    # turns those last-bit differences into code flips (0.057 once the governor switched)
    config = EngineConfig(num_blocks=num_blocks, record_logits=True, cache=cache,
                          adapt_threads=False)
    return Engine(loaded or tiny_model(), config).start()


def _compare_cached_with_uncached(loaded, kv_dtype, prompts, max_tokens):
    cached, uncached = _engine(kv_dtype, True, loaded), _engine(kv_dtype, False, loaded)
    try:
        outcomes = []
        for tokens in prompts:
            got = cached.generate(greedy(tokens, max_tokens=max_tokens), timeout=600)
            ref = uncached.generate(greedy(tokens, max_tokens=max_tokens), timeout=600)
            outcomes.append(compare_greedy(cached, got, uncached, ref, LOGIT_TOL[kv_dtype]))
        assert cached.snapshot().kv_dtype == kv_dtype
        assert cached.snapshot().tree.cached_tokens > 0
        assert_clean(cached)
        assert sum(o.full_match for o in outcomes) >= len(outcomes) - 1, outcomes
    finally:
        cached.shutdown(grace_s=0)
        uncached.shutdown(grace_s=0)


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_greedy_answers_with_and_without_the_prefix_cache_match_tiny(kv_dtype):
    loaded = tiny_model()
    base = loaded.tokenizer.encode("The radix tree shares one system prompt between requests. " * 2)
    prompts = [base, base + [11, 12, 13], base[:-3] + [21, 22], base + [11, 12, 13, 14, 15]]
    _compare_cached_with_uncached(loaded, kv_dtype, prompts, max_tokens=6)


@pytest.mark.realmodel
def test_greedy_answers_with_and_without_the_prefix_cache_match_real_int8(real_model):
    system = real_model.tokenizer.encode("You are a concise assistant for a museum. Answer in "
                                         "one short sentence. Question: ")
    prompts = [system + real_model.tokenizer.encode(q) for q in
               ["What is the capital of France?", "Name three primary colors.", "What is 12 times 11?"]]
    _compare_cached_with_uncached(real_model, "int8", prompts, max_tokens=8)
