"""Speculative decoding with prompt-lookup drafts (radixgate/runtime/engine/spec.py): drafts never
change the answer. On the default model in the deterministic mode, spec on and off give the
same tokens and logprob bits (greedy, with a stop string, seeded sampling, beside a request
that turned drafts off); on the tiny model the sampled tokens keep the model's distribution
(chi-square between spec on and off over 2,000 seeds each) and drafts never preempt."""
from __future__ import annotations

import pytest
import torch

from radixgate.kv import CacheConfig
from radixgate.runtime.engine.api import FinishReason, Request, SamplingParams
from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.engine.engine_config import EngineConfig
from radixgate.runtime.engine.spec import Drafter, SpecConfig
from tests.support.engine import tiny_model
from tests.support.engine_compare import assert_clean, generate_all

NGRAM = SpecConfig(mode="ngram")
ALWAYS = SpecConfig(mode="ngram", row_cost=0.001)   # drafts pay even in a batch of 64


# -- the drafter -------------------------------------------------------------------------

def test_drafts_are_what_followed_the_longest_recent_match():
    drafter = Drafter(SpecConfig(mode="ngram"))
    drafter.kept = 50.0                                       # a request that keeps drafts
    tokens = [1, 2, 3, 4, 5, 6, 9, 9, 2, 3, 4, 7, 2, 3, 4]
    assert drafter.propose(tokens, 8) == [7, 2, 3, 4]       # the latest (2, 3, 4) went on to 7
    assert drafter.propose([5, 6, 7, 8], 8) == []            # nothing repeats
    assert drafter.propose(tokens + [7], 2) == [2, 3]        # limited by the caller


def test_draft_length_follows_acceptance_and_batch_size():
    drafter = Drafter(SpecConfig(mode="ngram", probe_every=3))
    assert drafter.draft_length(8) == 3                       # prior 1/2, one stream: theta .10
    for _ in range(3):
        drafter.record(8, 8)
    assert drafter.draft_length(8) == 8 and drafter.draft_length(5) == 5
    assert drafter.draft_length(8, batch=16) >= 1             # kept drafts pay in a full batch
    fresh = Drafter(SpecConfig(mode="ngram", probe_every=3))
    assert [fresh.draft_length(8, batch=16) for _ in range(12)] == [0] * 11 + [1]  # a probe, every 3 x 16 // 4 steps
    for _ in range(6):
        fresh.record(3, 0)
    assert fresh.alpha < 0.2 and fresh.draft_length(8, batch=4) == 0


def _tree_with_drafts(num_blocks: int = 32, **spec):
    from radixgate.kv import BlockPool, RadixTree
    from radixgate.runtime.engine.spec import NamespaceDrafts
    pool = BlockPool(num_blocks, 4)
    drafts = NamespaceDrafts(SpecConfig(mode="ngram", **spec), block_size=4)
    tree = RadixTree(pool, on_event=drafts.on_event)
    return pool, tree, drafts


def test_namespace_drafts_follow_the_tree_and_stay_in_their_namespace():
    from tests.support.radix import cache
    pool, tree, drafts = _tree_with_drafts()
    cache(pool, tree, [5, 6, 7, 8, 9, 10, 11, 12, 13], "acme/ns")
    cache(pool, tree, [5, 6, 7, 80, 90, 91], "acme/ns#salt")
    assert drafts.propose("acme/ns", [1, 6, 7], 3) == [8, 9, 10]      # what it went on to say
    assert drafts.propose("acme/ns#salt", [1, 6, 7], 3) == [80, 90, 91]   # its own salt's path
    assert drafts.propose("globex/ns", [1, 6, 7], 3) == []              # another tenant
    drafter = Drafter(SpecConfig(mode="ngram"))
    drafter.kept = own_kept = 50.0                            # drafts that are usually kept
    assert drafter.propose([1, 6, 7], 4, drafts, "acme/ns") == [8, 9, 10, 11]
    own_first = Drafter(SpecConfig(mode="ngram"))
    own_first.kept = own_kept
    assert own_first.propose([6, 7, 1, 6, 7], 4, drafts, "acme/ns") == [1, 6, 7]
    tree.flush("acme/ns#salt")                                # the tree's removed events
    assert drafts.propose("acme/ns#salt", [1, 6, 7], 3) == []
    assert drafts.propose("acme/ns", [1, 6, 7], 3) == [8, 9, 10]


def test_namespace_drafts_lose_what_the_tree_evicts_and_keep_their_budget():
    from tests.support.radix import cache
    pool, tree, drafts = _tree_with_drafts(num_blocks=3)
    cache(pool, tree, [1, 2, 3, 4, 5, 6, 7, 8, 9], "ns")          # 3 blocks: all of them
    assert drafts.propose("ns", [0, 2, 3], 2) == [4, 5]
    assert tree.evict(3) == 3                                       # LRU takes all of it
    cache(pool, tree, [21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32], "ns")
    assert drafts.propose("ns", [0, 2, 3], 2) == []
    assert drafts.propose("ns", [0, 22, 23], 2) == [24, 25]
    assert drafts.tokens == sum(count for _, _, count in drafts.blocks.values()) == 12
    small_pool, small_tree, small = _tree_with_drafts(namespace_tokens=5)
    cache(small_pool, small_tree, [1, 2, 3, 4, 5, 6, 7, 8, 9], "ns")   # over budget: oldest go
    assert small.tokens <= 5 and small.propose("ns", [0, 2, 3], 2) == []
    assert small.propose("ns", [0, 6, 7], 1) == [8]


def test_the_config_refuses_nonsense():
    for bad in ({"mode": "eagle"}, {"max_draft": 0}, {"min_ngram": 0}, {"row_cost": 1.0}):
        with pytest.raises(ValueError):
            SpecConfig(**bad)


# -- exactness on the default model --------------------------------------------------------

CODE = "\n".join(f"def function_{i}(x, y):\n    total = x * {i} + y\n    return total - {i}\n"
                 for i in range(12))


@pytest.fixture(scope="module")
def default_int4():
    from radixgate.runtime.model.loader import load_model
    return load_model("default", max_model_len=2048)


def _edit_prompt(loaded) -> list[int]:
    tok = loaded.tokenizer
    messages = [{"role": "user", "content": "Repeat this file exactly:\n\n" + CODE}]
    return tok.encode(tok.apply_chat_template(messages))


def _outcome(finished):
    return (finished.output_token_ids, finished.text, finished.reason,
            [(lp.token_id, lp.logprob, lp.top) for lp in finished.logprobs])


def test_spec_on_and_off_give_the_same_bits_in_the_deterministic_mode(default_int4):
    prompt = _edit_prompt(default_int4)
    params = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=5),
              SamplingParams(max_tokens=60, temperature=0.0, stop=("function_2",), logprobs=2),
              SamplingParams(max_tokens=40, temperature=0.8, seed=11, ignore_eos=True,
                             logprobs=3),
              SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, logprobs=5,
                             speculative=False)]
    outcomes, spec = {}, {}
    for mode in ("none", "ngram"):
        engine = Engine(default_int4, EngineConfig(
            num_blocks=256, deterministic=True, spec=SpecConfig(mode=mode),
            cache=CacheConfig(enable_prefix_cache=False))).start()
        try:
            finished = generate_all(engine, [Request(list(prompt), p) for p in params])
            outcomes[mode] = [_outcome(f) for f in finished]
            spec[mode] = dict(engine.request_snapshot().result(timeout=30).spec)
            assert_clean(engine)
        finally:
            engine.shutdown(grace_s=0)
    assert outcomes["ngram"] == outcomes["none"]
    assert outcomes["none"][1][2] is FinishReason.STOP_SEQUENCE
    assert spec["none"]["drafted"] == 0
    assert spec["ngram"]["accepted"] > 20 and spec["ngram"]["steps"] < 100   # it did speculate


# -- the distribution and the blocks, on the tiny model ------------------------------------

PATTERN = [1000, 2000, 3000, 4000]       # the only tokens the bias leaves likely


def _flattening_bias() -> tuple[tuple[int, float], ...]:
    """Biases that lift the pattern's tokens above all others and make them about equally
    likely after the prompt (the tiny model's own logits differ by ~10 there), so drafts
    are rejected often as well as kept."""
    from radixgate.runtime.model.batch import build_forward_batch
    from radixgate.runtime.model.kv_cache import KVCache
    loaded = tiny_model()
    c = loaded.config
    kv = KVCache(c.num_layers, 8, 16, c.num_kv_heads, c.head_dim)
    logits = loaded.model.forward(build_forward_batch([PATTERN * 6], [0], [list(range(8))], 16),
                                  kv)[0]
    return tuple((t, round(30.0 - float(logits[t]), 2)) for t in PATTERN)


def _pattern_request(seed: int, speculative: bool, bias) -> Request:
    return Request(PATTERN * 6, SamplingParams(max_tokens=4, temperature=1.0, seed=seed,
                                               ignore_eos=True, logit_bias=bias,
                                               speculative=speculative))


@pytest.fixture(scope="module")
def bias():
    return _flattening_bias()


def _chi_square_p(a: list[tuple], b: list[tuple]) -> float:
    """Two-sample chi-square test of homogeneity over the outcomes seen."""
    keys = sorted(set(a) | set(b))
    counts = torch.tensor([[a.count(k) for k in keys], [b.count(k) for k in keys]],
                          dtype=torch.float64)
    keep = counts.sum(0) >= 10                       # pool rare outcomes into one cell
    table = torch.cat([counts[:, keep], counts[:, ~keep].sum(1, keepdim=True)], 1)
    table = table[:, table.sum(0) > 0]
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    statistic = ((table - expected) ** 2 / expected).sum()
    dof = table.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                         statistic / 2))


def test_sampled_tokens_keep_the_models_distribution_with_drafts(bias):
    """2,000 sampled answers with drafts and 2,000 without come from one distribution.
    Every one must have run to its length: a refused request's empty output counted as an
    outcome once made this fail about half the time under load (generate_all keeps its
    requests within the engine's queue and checks how each finished)."""
    samples = {}
    drafted = {}
    for spec_on in (True, False):
        engine = Engine(tiny_model(), EngineConfig(num_blocks=512, max_num_seqs=64,
                                                   spec=ALWAYS)).start()
        try:
            offset = 0 if spec_on else 100_000                # independent seeds
            finished = generate_all(engine, [_pattern_request(offset + i, spec_on, bias)
                                              for i in range(2000)],
                                    expect=(FinishReason.LENGTH,))
            samples[spec_on] = [f.output_token_ids[1:] for f in finished]
            drafted[spec_on] = dict(engine.request_snapshot().result(timeout=30).spec)
        finally:
            engine.shutdown(grace_s=0)
    counts = drafted[True]
    assert counts["accepted"] >= 10 and counts["drafted"] - counts["accepted"] >= 100, counts
    assert drafted[False]["drafted"] == 0
    assert _chi_square_p(samples[True], samples[False]) >= 0.001


def test_a_seeded_sample_is_the_same_with_and_without_drafts_when_deterministic(bias):
    got = {}
    for spec_on in (True, False):
        engine = Engine(tiny_model(), EngineConfig(num_blocks=256, deterministic=True,
                                                   spec=ALWAYS)).start()
        try:
            got[spec_on] = [f.output_token_ids for f in generate_all(
                engine, [_pattern_request(i, spec_on, bias) for i in range(64)],
                expect=(FinishReason.LENGTH,))]
        finally:
            engine.shutdown(grace_s=0)
    assert got[True] == got[False]


def test_constrained_rows_draft_within_their_grammar_and_answer_the_same():
    import re

    from radixgate.runtime.engine.grammar import GrammarCompiler, regex_grammar
    loaded = tiny_model()
    compiler = GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size)
    pattern = r"(red|green)( (red|green)){30}"
    prompt = loaded.tokenizer.encode("red green red green red green red green red green")
    got, counts = {}, {}
    for spec_on in (True, False):
        engine = Engine(loaded, EngineConfig(num_blocks=64, deterministic=True, spec=NGRAM)
                        ).start()
        try:
            request = Request(list(prompt), SamplingParams(max_tokens=64, temperature=0.0,
                                                           speculative=spec_on),
                              grammar=compiler.compile(regex_grammar(pattern)).matcher())
            got[spec_on] = engine.generate(request, timeout=120)
            counts[spec_on] = dict(engine.request_snapshot().result(timeout=30).spec)
        finally:
            engine.shutdown(grace_s=0)
    assert re.fullmatch(pattern, got[True].text), got[True].text
    assert got[True].output_token_ids == got[False].output_token_ids
    assert counts[True]["accepted"] > 0 and counts[False]["drafted"] == 0


def test_draft_blocks_come_only_from_free_ones_never_from_the_cache():
    """``grow_from_free`` allocates from free blocks only, keeping ``keep_free`` of them:
    where a plain ``grow`` would evict the tree's cached prefix, it refuses instead."""
    from radixgate.kv import BlockPool, RadixTree
    from radixgate.kv.manager import KVManager
    from radixgate.runtime.engine.sequence import Sequence
    from tests.support.radix import cache
    pool = BlockPool(6, 4)
    tree = RadixTree(pool)
    cache(pool, tree, list(range(12)))                       # 3 blocks cached, evictable
    blocks = KVManager(tree, pool, kv=None)
    seq = Sequence(Request([1, 2, 3]), arrival=1)
    assert blocks.grow_from_free(seq, 8, keep_free=1)        # 2 of the 3 free blocks
    assert not blocks.grow_from_free(seq, 12, keep_free=1)   # the last free one is kept
    assert not blocks.grow_from_free(seq, 20)                # would need the cache's blocks
    assert len(seq.kv.block_table) == 2 and tree.stats().cached_tokens == 12
    assert blocks.grow(seq, 20)                              # a decode's grow evicts
    assert tree.stats().cached_tokens < 12


def test_drafts_in_a_tight_pool_preempt_nothing():
    """12 blocks of 16 for four 24-token prompts growing to 40: each needs 3 blocks, none
    spare; with drafts every request still runs to the end without a preemption."""
    engine = Engine(tiny_model(), EngineConfig(num_blocks=12, spec=ALWAYS,
                                               cache=CacheConfig(enable_prefix_cache=False))
                    ).start()
    try:
        bias = ((PATTERN[0], 100.0),)                        # one token forever: drafts match
        requests = [Request(PATTERN * 6, SamplingParams(max_tokens=16, temperature=0.0,
                                                        ignore_eos=True, logit_bias=bias))
                    for _ in range(4)]
        finished = generate_all(engine, requests, expect=(FinishReason.LENGTH,))
        assert all(f.output_token_ids == (PATTERN[0],) * 16 for f in finished)
        snap = engine.request_snapshot().result(timeout=30)
        assert snap.spec["accepted"] > 0 and snap.preemptions == 0
        assert_clean(engine)
    finally:
        engine.shutdown(grace_s=0)
