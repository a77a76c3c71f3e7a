"""radixgate/runtime/model/head.py's RescoredHead on a random weight: each row's top k logits equal the
float32 product, the rest stay close, and every row count (none, one, many) works."""
from __future__ import annotations

import pytest
import torch

from radixgate.runtime.model.head import (WEIGHT_ONLY_MAX_ROWS, RescoredHead, int_mm_available,
                                          weight_only_wins)
from radixgate.runtime.model.linear import cpu_flags

pytestmark = pytest.mark.skipif(not int_mm_available(), reason="torch.ops.aten._int_mm is missing")


def make(k: int = 8):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(512, 64, generator=gen) * 0.05
    return weight, RescoredHead.from_weight(weight, lambda ids: weight[ids], k=k)


@pytest.mark.parametrize("weight_only_rows", [0, WEIGHT_ONLY_MAX_ROWS])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_the_top_logits_are_exact_and_the_rest_close(rows, weight_only_rows):
    weight, head = make()
    head.weight_only_rows = weight_only_rows           # both approximations, on any CPU
    h = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
    exact = h @ weight.t()
    got = head(h)
    assert got.shape == exact.shape and got.dtype == torch.float32
    top = exact.topk(4, dim=1).indices
    assert torch.allclose(got.gather(1, top), exact.gather(1, top), atol=1e-5)
    assert (got.argmax(1) == exact.argmax(1)).all()
    spread = exact.abs().max().item()
    assert (got - exact).abs().max().item() < 0.05 * spread       # int8 x int8 elsewhere


def test_a_row_or_two_go_through_the_weight_only_op_where_it_wins():
    """One row: the bf16 weight-only int8 op's product on an AMX CPU (1.8x faster than
    ``_int_mm`` there), ``_int_mm``'s over int8 activations elsewhere and above 2 rows."""
    _, head = make()
    h = torch.randn(3, 64, generator=torch.Generator().manual_seed(5))
    weight_only = torch.ops.aten._weight_int8pack_mm(
        h.to(torch.bfloat16), head.codes, head.scale_bf16).float()
    assert weight_only_wins() == ("amx_int8" in cpu_flags())
    head.weight_only_rows = WEIGHT_ONLY_MAX_ROWS
    assert torch.equal(head.approximate(h[:1]), weight_only[:1])
    assert torch.equal(head.approximate(h[:2]), weight_only[:2])
    assert not torch.equal(head.approximate(h), weight_only)      # 3 rows: _int_mm
    head.weight_only_rows = 0
    assert not torch.equal(head.approximate(h[:1]), weight_only[:1])


def test_no_rows_give_an_empty_result():
    _, head = make()
    assert head(torch.empty(0, 64)).shape == (0, 512)


def test_k_is_bounded_by_the_vocabulary_and_bytes_are_the_codes_and_scales():
    _, head = make(k=10_000)
    assert head.k == 512 and head.nbytes == 512 * 64 + (4 + 2) * 512   # fp32 and bf16 scales
    assert head(torch.randn(2, 64)).shape == (2, 512)


@pytest.mark.realmodel
def test_the_default_model_answers_a_prompt_longer_than_one_step(default_model_path):
    """Prefill chunks that want no logits run the head on zero rows; the auto weights of
    the default GGUF have this head."""
    from radixgate.runtime.engine.engine import Engine
    from radixgate.runtime.model.loader import load_model
    from tests.support.engine import engine_config
    from tests.support.engine_compare import assert_clean, greedy

    loaded = load_model(str(default_model_path), device="cpu", dtype="float32")
    assert isinstance(loaded.model.logits_proj, RescoredHead)
    engine = Engine(loaded, engine_config(num_blocks=64, max_step_tokens=128)).start()
    try:
        done = engine.generate(greedy(list(range(1000, 1600)), max_tokens=4))
        assert done.error_kind is None and len(done.output_token_ids) == 4
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)


def test_from_q8_0_blocks_matches_the_float_weight_path():
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(-127, 128, (256, 4, 32), generator=gen, dtype=torch.int8)
    scales = (torch.rand(256, 4, 1, generator=gen) * 0.01).to(torch.float16)
    weight = (codes.float() * scales.float()).view(256, 128)
    rows = lambda ids: weight[ids]                                      # noqa: E731
    direct, via_float = RescoredHead.from_blocks(codes, scales, rows), RescoredHead.from_weight(weight, rows)
    assert torch.allclose(direct.scale, via_float.scale)
    assert (direct.codes_t.int() - via_float.codes_t.int()).abs().max() <= 1   # rounding only
    h = torch.randn(3, 128, generator=gen)
    assert torch.allclose(direct(h).gather(1, direct(h).topk(4).indices),
                          (h @ weight.t()).gather(1, direct(h).topk(4).indices), atol=1e-5)
