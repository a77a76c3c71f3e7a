"""The default SmolLM2 model: our forward against transformers loading the same GGUF (fp32),
and paged prefix/suffix and decode equal to one contiguous forward. Prompts <= 200 tokens."""
import pytest
import torch

from radixgate.runtime.model.batch import build_forward_batch
from radixgate.runtime.model.kv_cache import KVCache

pytestmark = pytest.mark.realmodel

# Observed max |ours - transformers| on this CPU: 0.0 (same fp32 kernels, same reduction order).
# Bound allows for another BLAS build reordering sums; logits span about +-40.
LOGITS_TOLERANCE = 1e-3
BLOCK = 16


@pytest.fixture(scope="module")
def prompt_ids(real_model):
    tok = real_model.tokenizer
    text = tok.apply_chat_template([
        {"role": "system", "content": "You are a careful assistant. Answer in one short paragraph."},
        {"role": "user", "content": "Why is the sky blue during the day but red at sunset? "
                                    "Mention Rayleigh scattering and the path length of light. 🌅"}])
    ids = tok.encode(text)
    assert 50 <= len(ids) <= 100
    return ids


def assert_close(actual, expected, rtol, atol):
    """Elementwise |a - e| <= atol + rtol |e| (torch.testing.assert_close takes seconds on
    millions of logits)."""
    assert actual.shape == expected.shape
    excess = ((actual - expected).abs() - (atol + rtol * expected.abs())).max().item()
    assert excess <= 0, f"max |diff| {(actual - expected).abs().max().item():.3g} beyond tolerance"


def run(model, kv, new, cached, table, rows=None):
    return model.forward(build_forward_batch([new], [cached], [table], BLOCK, logits_rows=rows), kv)


def cache_for(loaded, num_blocks=32):
    cfg = loaded.config
    return KVCache(cfg.num_layers, num_blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim)


@pytest.fixture(scope="module")
def one_shot_logits(real_model, prompt_ids):
    rows = [list(range(len(prompt_ids)))]
    return run(real_model.model, cache_for(real_model), prompt_ids, 0, list(range(8)), rows)


def test_logits_match_transformers_on_the_gguf(hf_reference_model, prompt_ids, one_shot_logits):
    with torch.inference_mode():
        reference = hf_reference_model(torch.tensor([prompt_ids])).logits[0].float()
    diff = (one_shot_logits - reference).abs().max().item()
    print(f"max |ours - transformers| over {len(prompt_ids)} x 49152 logits: {diff:.3g}")
    assert reference.abs().max() > 5          # a real model, not zeros
    assert diff < LOGITS_TOLERANCE
    assert torch.equal(one_shot_logits.argmax(-1), reference.argmax(-1))


def test_prefix_then_suffix_on_scattered_blocks_equals_one_shot(real_model, prompt_ids, one_shot_logits):
    kv = cache_for(real_model)
    table = [17, 3, 29, 8, 21, 0, 12, 25]                 # non-contiguous, out of order
    cut = 37                                              # inside block 2
    first = run(real_model.model, kv, prompt_ids[:cut], 0, table, [list(range(cut))])
    rest = prompt_ids[cut:]
    second = run(real_model.model, kv, rest, cut, table, [list(range(len(rest)))])
    assert_close(torch.cat([first, second]), one_shot_logits, rtol=1e-4, atol=1e-3)


def test_decode_step_equals_full_forward_last_logits(real_model, prompt_ids, one_shot_logits):
    kv = cache_for(real_model)
    table = list(range(31, 23, -1))
    run(real_model.model, kv, prompt_ids[:-1], 0, table)
    step = run(real_model.model, kv, prompt_ids[-1:], len(prompt_ids) - 1, table)
    assert_close(step[0], one_shot_logits[-1], rtol=1e-4, atol=1e-3)


def test_greedy_answer_is_sensible(real_model):
    tok = real_model.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    kv, table = cache_for(real_model, 8), list(range(8))
    logits = run(real_model.model, kv, ids, 0, table)
    out = []
    for _ in range(8):
        out.append(int(logits[-1].argmax()))
        if out[-1] in tok.eos_token_ids:
            break
        logits = run(real_model.model, kv, out[-1:], len(ids) + len(out) - 1, table)
    assert "Paris" in tok.decode(out)
