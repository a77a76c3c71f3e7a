"""The forward pass over paged KV on the tiny model: chunking, block placement, batching and
decode all give the logits of one contiguous forward."""
import random

import pytest
import torch

from radixgate.runtime.model.batch import build_forward_batch
from radixgate.runtime.model.kv_cache import KVCache
from radixgate.runtime.model.loader import load_model

BLOCK = 4   # small blocks so short prompts span many, and chunk edges fall inside blocks
TOL = dict(rtol=1e-5, atol=1e-4)   # fp32 rounding of different matmul row counts; errors are O(1)


def assert_close(actual, expected, rtol, atol):
    """Elementwise |a - e| <= atol + rtol |e| (torch.testing.assert_close takes seconds on
    millions of logits)."""
    assert actual.shape == expected.shape
    excess = ((actual - expected).abs() - (atol + rtol * expected.abs())).max().item()
    assert excess <= 0, f"max |diff| {(actual - expected).abs().max().item():.3g} beyond tolerance"


def new_cache(cfg, num_blocks: int = 64) -> KVCache:
    return KVCache(cfg.num_layers, num_blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim)


def forward(model, kv, seqs, logits_rows=None):
    """seqs: list of (new_tokens, num_cached, block_table)."""
    batch = build_forward_batch([s[0] for s in seqs], [s[1] for s in seqs], [s[2] for s in seqs],
                                BLOCK, logits_rows=logits_rows)
    return model.forward(batch, kv)


def all_rows(tokens):
    return [list(range(len(tokens)))]


@pytest.fixture(scope="module")
def prompt(tiny_model):
    return tiny_model.tokenizer.encode(
        "The radix tree shares one system prompt between thousands of requests. " * 3)


def test_tiny_model_shape_and_tokenizer(tiny_model, prompt):
    cfg = tiny_model.config
    assert cfg.vocab_size == 49152 and cfg.hidden_size == 64 and cfg.num_kv_heads == 2
    assert tiny_model.tokenizer.vocab_size == 49152 and "<|im_start|>" in tiny_model.tokenizer.chat_template
    assert tiny_model.model.dtype == torch.float32 and len(prompt) >= 40


def test_same_seed_same_weights_other_seed_differs(tiny_model, prompt):
    again, other = load_model(tiny=True), load_model(tiny=True, seed=1)
    seq = [(prompt, 0, list(range(20)))]
    ref = forward(tiny_model.model, new_cache(tiny_model.config), seq)
    assert torch.equal(forward(again.model, new_cache(again.config), seq), ref)
    assert not torch.allclose(forward(other.model, new_cache(other.config), seq), ref)


def test_two_chunks_on_shuffled_blocks_equal_one_shot(tiny_model, prompt):
    model, cfg = tiny_model.model, tiny_model.config
    one_shot = forward(model, new_cache(cfg), [(prompt, 0, list(range(20)))], all_rows(prompt))
    table = random.Random(0).sample(range(64), 20)        # scattered, non-contiguous block ids
    kv = new_cache(cfg)
    cut = 9                                                # inside a block (9 % 4 != 0)
    first = forward(model, kv, [(prompt[:cut], 0, table)], all_rows(prompt[:cut]))
    second = forward(model, kv, [(prompt[cut:], cut, table)], all_rows(prompt[cut:]))
    assert_close(torch.cat([first, second]), one_shot, **TOL)


def test_decode_steps_equal_full_forward_last_logits(tiny_model, prompt):
    model, cfg = tiny_model.model, tiny_model.config
    table = list(range(40, 60))
    kv = new_cache(cfg)
    forward(model, kv, [(prompt[:-3], 0, table)])
    for n in range(len(prompt) - 3, len(prompt)):
        step = forward(model, kv, [([prompt[n]], n, table)])
        full = forward(model, new_cache(cfg), [(prompt[:n + 1], 0, table)])
        assert_close(step, full, **TOL)


def test_mixed_batch_of_prefill_extend_and_decode_equals_separate_runs(tiny_model, prompt):
    model, cfg = tiny_model.model, tiny_model.config
    a, b, c = prompt[:13], prompt[5:30], prompt[2:20]
    tables = [[3, 7, 11, 15], [1, 2, 4, 5, 6, 8, 9], [20, 21, 22, 23, 24]]
    kv = new_cache(cfg)
    forward(model, kv, [(b[:20], 0, tables[1]), (c[:-1], 0, tables[2])])   # b and c partly cached
    batched = forward(model, kv, [(a, 0, tables[0]), (b[20:], 20, tables[1]), (c[-1:], len(c) - 1, tables[2])],
                      logits_rows=[[0, 12], [4], [0]])
    separate = [forward(model, new_cache(cfg), [(s, 0, [0, 1, 2, 3, 4, 5, 6, 7])], [rows])
                for s, rows in ((a, [0, 12]), (b, [24]), (c, [17]))]
    assert_close(batched, torch.cat(separate), **TOL)


def test_logits_only_for_requested_rows(tiny_model, prompt):
    model, cfg = tiny_model.model, tiny_model.config
    full = forward(model, new_cache(cfg), [(prompt, 0, list(range(20)))], all_rows(prompt))
    some = forward(model, new_cache(cfg), [(prompt, 0, list(range(20)))], [[0, 5, len(prompt) - 1]])
    assert some.shape == (3, 49152) and some.dtype == torch.float32
    assert_close(some, full[[0, 5, len(prompt) - 1]], **TOL)


def test_forward_writes_only_its_own_slots(tiny_model, prompt):
    model, cfg = tiny_model.model, tiny_model.config
    kv = new_cache(cfg)
    sentinel = 7.0
    for k, v in zip(kv.k, kv.v):
        k.fill_(sentinel)
        v.fill_(sentinel)
    forward(model, kv, [(prompt[:6], 0, [9, 30])])          # positions 0..5: block 9 full, 30 slots 0-1
    for layer in range(cfg.num_layers):
        written = torch.zeros(64, BLOCK, dtype=torch.bool)
        written[9, :] = True
        written[30, :2] = True
        for cache in (kv.k[layer], kv.v[layer]):
            untouched = (cache == sentinel).all(-1).all(-1)  # [blocks, slots]
            assert torch.equal(~untouched, written)


def test_kv_cache_budget_arithmetic_and_views(tiny_model):
    cfg = tiny_model.config
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    assert cfg.kv_bytes_per_token(4) == per_token
    kv = KVCache.from_budget(cfg, budget_bytes=per_token * 16 * 10 + 5, block_size=16)
    assert kv.num_blocks == 10 and kv.num_tokens == 160 and kv.bytes_per_token == per_token
    assert kv.nbytes == per_token * 160
    assert kv.k[1].shape == (10, 16, cfg.num_kv_heads, cfg.head_dim)
    with pytest.raises(ValueError, match="no block"):
        KVCache.from_budget(cfg, budget_bytes=per_token * 15, block_size=16)


def test_copy_blocks_copies_prefix_slots_in_every_layer(tiny_model):
    cfg = tiny_model.config
    kv = new_cache(cfg, num_blocks=8)
    for layer in range(cfg.num_layers):
        kv.k[layer].copy_(torch.randn_like(kv.k[layer]))
        kv.v[layer].copy_(torch.randn_like(kv.v[layer]))
    before = [t.clone() for t in kv.k + kv.v]
    kv.copy_blocks(torch.tensor([[2, 5]]), torch.tensor([3], dtype=torch.int32))
    for cache, old in zip(kv.k + kv.v, before):
        assert torch.equal(cache[5, :3], old[2, :3]) and torch.equal(cache[5, 3:], old[5, 3:])
        assert torch.equal(cache[:5], old[:5])


def test_bf16_model_follows_fp32_within_bf16_rounding(tiny_model, prompt):
    bf16 = load_model(tiny=True, dtype=torch.bfloat16)
    cfg = bf16.config
    kv = KVCache(cfg.num_layers, 32, BLOCK, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16)
    low = forward(bf16.model, kv, [(prompt, 0, list(range(20)))], all_rows(prompt))
    full = forward(tiny_model.model, new_cache(cfg), [(prompt, 0, list(range(20)))], all_rows(prompt))
    assert low.dtype == torch.float32 and bf16.model.layers[0].qkv.dtype == torch.bfloat16
    assert (low - full).abs().max() < 0.05 * full.abs().max()
    assert (low.argmax(-1) == full.argmax(-1)).float().mean() >= 0.9
