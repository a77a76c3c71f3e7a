"""Greedy outputs with the prefix cache equal those without it (real SmolLM2 model).

Near-tie rule (docs/ARCHITECTURE.md section 7): tokens are compared up to the first step whose top-2
logit gap is below 1e-3; up to there the logits must agree within LOGIT_TOL (CPU matmul
rounding differs with how many rows go through together). Most comparisons must match to
the end. After every scenario: tree/pool integrity, free + held == total, nothing locked.

Every scenario runs twice: in the default mode under that rule, and in the deterministic
mode (docs/ARCHITECTURE.md section 5c) with equal bits required (the real model's float32
weights: oneDNN's GEMMs in fixed 16-row tiles).
"""
import pytest

from radixgate.kv import CacheConfig
from radixgate.runtime.engine.api import FinishReason
from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.engine.engine_config import EngineConfig
from tests.support.engine_compare import assert_clean, compare_greedy, greedy, held

pytestmark = pytest.mark.realmodel

LOGIT_TOL = 1e-3     # max |logit difference| allowed before a near tie (fp32 CPU; seen ~1e-4)
NEW_TOKENS = 12
QUESTIONS = ["What is the capital of France?", "Name three primary colors.",
             "How many legs does a spider have?", "What is 12 times 11?"]
SYSTEM = ("You are a concise assistant for a museum of natural history. Answer in one short "
          "sentence, mention a relevant exhibit when you can, and never invent opening hours.")


@pytest.fixture(scope="module")
def model(real_model):
    """The session's real model (tests/conftest.py: loaded once per session)."""
    return real_model


# the deterministic mode's scenarios in CI (the float32 weights' 16-row tiles make it ~2x
# slower here; every schedule kind is also fuzzed on the int4 model by test_deterministic_fuzz)
EXACT_IN_CI = {"test_hit_ending_inside_a_block_copies_and_matches",
               "test_concurrent_requests_sharing_a_prefix_match_uncached",
               "test_preemption_and_resume_match_uncached"}


@pytest.fixture(scope="module", params=[False, True], ids=["default", "deterministic"])
def deterministic(request):
    return request.param


@pytest.fixture(autouse=True)
def _exact_scenarios_only(request, deterministic):
    if deterministic and request.node.originalname not in EXACT_IN_CI:
        pytest.skip("deterministic mode: the scenarios of EXACT_IN_CI (the rest fuzzed "
                    "in test_deterministic_fuzz.py)")


@pytest.fixture(scope="module")
def reference(model, deterministic):
    engine = Engine(model, EngineConfig(num_blocks=256, record_logits=True,
                                        deterministic=deterministic,
                                        cache=CacheConfig(enable_prefix_cache=False))).start()
    yield engine
    engine.shutdown(grace_s=0)


@pytest.fixture(scope="module")
def cached(model, deterministic):
    engine = Engine(model, EngineConfig(num_blocks=256, record_logits=True,
                                        deterministic=deterministic)).start()
    yield engine
    engine.shutdown(grace_s=0)


@pytest.fixture
def check(cached, reference, deterministic):
    """Runs prompts on the cached engine (after a flush) and compares each to the reference."""
    outcomes = []
    cached.flush().result()

    def compare(got):
        ref = reference.generate(greedy(_prompt_of(got), max_tokens=len(got.output_token_ids)))
        outcomes.append(compare_greedy(cached, got, reference, ref, LOGIT_TOL, deterministic))
        return got

    yield compare
    worst = max((o.max_logit_diff for o in outcomes), default=0.0)
    print(f"\n[equivalence] {sum(o.full_match for o in outcomes)}/{len(outcomes)} full matches, "
          f"max |logit diff| {worst:.2e}")
    assert_clean(cached)
    assert sum(o.full_match for o in outcomes) >= max(1, len(outcomes) - 1), outcomes


_PROMPTS: dict[str, list[int]] = {}


def _run(engine, tokens, max_tokens=NEW_TOKENS, **fields):
    request = greedy(tokens, max_tokens=max_tokens, **fields)
    _PROMPTS[request.request_id] = list(tokens)
    return engine.generate(request, timeout=600)


def _prompt_of(finished):
    return _PROMPTS[finished.request_id]


def _chat(model, question: str, system: str = SYSTEM) -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return model.tokenizer.encode(model.tokenizer.apply_chat_template(messages))


def test_full_prompt_hit_matches_uncached(model, cached, check):
    prompt = _chat(model, QUESTIONS[0])
    check(_run(cached, prompt))
    hit = check(_run(cached, prompt))
    assert hit.usage.cache_read_tokens == len(prompt) - 1


def test_hit_ending_inside_a_block_copies_and_matches(model, cached, check):
    prompt = _chat(model, QUESTIONS[1])
    head = prompt[:45]                        # 45 % 16 != 0: the cached prefix ends inside a block
    check(_run(cached, head, max_tokens=1))   # one new token: exactly `head` gets cached
    extended = check(_run(cached, prompt))
    assert extended.usage.cache_read_tokens == 45


def test_node_split_then_both_branches_hit(model, cached, check):
    first = _chat(model, QUESTIONS[2])
    cut = 37                                  # inside block 2: parent and child share it
    other = model.tokenizer.encode(" Completely unrelated: which dinosaur was the largest?")
    assert other[0] != first[cut]
    second = first[:cut] + other
    check(_run(cached, first))
    branch = check(_run(cached, second))
    assert branch.usage.cache_read_tokens == cut
    again = check(_run(cached, first))
    assert again.usage.cache_read_tokens == len(first) - 1


def test_multi_turn_reuses_all_but_the_last_token(model, cached, check):
    turn1 = _chat(model, QUESTIONS[0])
    answer = check(_run(cached, turn1))
    follow = model.tokenizer.encode("<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n"
                                    "<|im_start|>assistant\n")
    history = turn1 + list(answer.output_token_ids)
    turn2 = check(_run(cached, history + follow))
    assert turn2.usage.cache_read_tokens == len(history) - 1


def test_concurrent_requests_sharing_a_prefix_match_uncached(model, cached, check):
    prompts = [_chat(model, q) for q in QUESTIONS]
    requests = [greedy(p, max_tokens=NEW_TOKENS) for p in prompts]
    for request, prompt in zip(requests, prompts):
        _PROMPTS[request.request_id] = prompt
    with held(cached):
        futures = [cached.submit_future(r) for r in requests]
    results = [check(f.result(timeout=600)) for f in futures]
    shared = _common_prefix(prompts)
    assert results[0].usage.cache_read_tokens == 0
    assert all(r.usage.cache_read_tokens >= shared for r in results[1:])


def test_preemption_and_resume_match_uncached(model, reference, deterministic):
    small = Engine(model, EngineConfig(num_blocks=14, record_logits=True,
                                       deterministic=deterministic)).start()
    try:
        personas = ["Pirate captain of the northern seas.", "Chef of a small bistro in Lyon.",
                    "Astronomy lecturer at a night school."]
        # distinct 60-token prompts: 3 x 4 blocks admitted, then 3 x 5 > 14 blocks to decode
        prompts = [_chat(model, q, system=p + " " + SYSTEM)[:60]
                   for p, q in zip(personas, QUESTIONS)]
        requests = [greedy(p, max_tokens=NEW_TOKENS) for p in prompts]
        with held(small):
            futures = [small.submit_future(r) for r in requests]
        results = [f.result(timeout=600) for f in futures]
        assert small.request_snapshot().result().preemptions > 0
        outcomes = [compare_greedy(small, got, reference,
                                   reference.generate(greedy(p, max_tokens=NEW_TOKENS)), LOGIT_TOL,
                                   deterministic)
                    for got, p in zip(results, prompts)]
        assert sum(o.full_match for o in outcomes) >= 2
        assert_clean(small)
    finally:
        small.shutdown(grace_s=0)


def test_abort_mid_decode_then_rerun_matches_uncached(model, cached, check):
    prompt = _chat(model, QUESTIONS[3])
    request = greedy(prompt, max_tokens=NEW_TOKENS)
    seen = []

    def abort_after_three(event):
        seen.append(event)
        if len(seen) == 3:
            cached.abort(request.request_id)

    aborted = cached.submit_future(request, on_event=abort_after_three).result(timeout=600)
    assert aborted.reason is FinishReason.ABORTED
    assert len(aborted.output_token_ids) < NEW_TOKENS
    assert_clean(cached)
    rerun = check(_run(cached, prompt))
    assert rerun.usage.cache_read_tokens == len(prompt) - 1


def _common_prefix(prompts):
    length = 0
    while all(len(p) > length and p[length] == prompts[0][length] for p in prompts):
        length += 1
    return length
