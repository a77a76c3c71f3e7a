"""Deterministic mode on the real default model (int4 weights): the top-20 logprobs of every
generated position are the same bits however the requests were scheduled.

Hypothesis draws the schedules: prompts over shared prefixes (the reused part ends inside a
block, on a block boundary, or is the whole prompt), their order, how many run at once, the
prefill chunk size, the thread count (and switches between 1 and 2 threads from step to step,
in the middle of requests), a KV budget small enough to preempt, and a filler that pushes the
first prompts' blocks out to the disk tier before the rest read them back. Beside the greedy
rows run a constrained row, a duplicate prompt (``n`` > 1) and a seeded sampled row, whose
own tokens and logprobs must not move either. Every position is compared with the same
prompt run alone, cold, on a reference engine, for float32 and int8 KV.
"""
from __future__ import annotations

import contextlib
import random
import tempfile
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from radixgate.kv import CacheConfig, DiskTierConfig
from radixgate.runtime.engine import engine as engine_module
from radixgate.runtime.engine.api import Request, SamplingParams
from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.engine.engine_config import EngineConfig
from radixgate.runtime.engine.grammar import GrammarCompiler, regex_grammar
from tests.support.finished import assert_finished

ANSWER = 4                       # generated positions per request
TOP = 20                         # OpenAI's most: every one of them compared
PREFIX_LENGTHS = (16, 41, 70)    # shared heads: on a block boundary and inside blocks
BLOCK = 16
SEED = 1234


@pytest.fixture(scope="module")
def default_int4():
    from radixgate.runtime.model.loader import load_model
    loaded = load_model("default", max_model_len=1024)
    assert loaded.model.weights_dtype == "int4" or not torch.backends.cpu.get_cpu_capability() \
        .startswith("AVX"), "the default model runs int4 on this CPU"
    return loaded


@pytest.fixture(scope="module")
def compiler(default_int4):
    return GrammarCompiler(default_int4.tokenizer, default_int4.config.vocab_size)


def prefixes(vocab: int) -> list[list[int]]:
    rng = random.Random(SEED)
    return [[rng.randrange(100, vocab) for _ in range(n)] for n in PREFIX_LENGTHS]


def prompt_of(spec: tuple[int, int, int], heads: list[list[int]], vocab: int) -> list[int]:
    """(prefix index, suffix length, suffix seed) -> tokens (suffix 0: the prefix alone)."""
    index, length, seed = spec
    rng = random.Random(seed)
    return heads[index] + [rng.randrange(100, vocab) for _ in range(length)]


def sampling(kind: str) -> SamplingParams:
    if kind == "seeded":
        return SamplingParams(max_tokens=ANSWER, temperature=0.9, seed=7, ignore_eos=True,
                              logprobs=TOP)
    return SamplingParams(max_tokens=ANSWER, temperature=0.0, ignore_eos=True, logprobs=TOP)


def outcome(finished) -> list[tuple]:
    """Every generated position: its token, logprob and top-20 (ids and float32 values)."""
    assert len(finished.output_token_ids) == len(finished.logprobs) == ANSWER, finished
    return [(lp.token_id, lp.logprob, lp.top) for lp in finished.logprobs]


class References:
    """Each prompt alone, cold (prefix cache off), one chunk, two threads, on its own
    deterministic engine per KV dtype."""

    def __init__(self, loaded):
        self.loaded, self.engines, self.done = loaded, {}, {}

    def get(self, kv_dtype: str, tokens: list[int], kind: str) -> list[tuple]:
        key = (kv_dtype, tuple(tokens), kind)
        if key not in self.done:
            engine = self.engines.get(kv_dtype)
            if engine is None:
                config = EngineConfig(cache=CacheConfig(kv_dtype=kv_dtype,
                                                        enable_prefix_cache=False),
                                      num_blocks=64, deterministic=True, adapt_threads=False,
                                      max_num_seqs=1)
                engine = self.engines[kv_dtype] = Engine(self.loaded, config).start()
            request = Request(list(tokens), sampling(kind), tenant="t", namespace="ns")
            self.done[key] = outcome(engine.generate(request, timeout=120))
        return self.done[key]

    def close(self):
        for engine in self.engines.values():
            engine.shutdown(grace_s=0)


@pytest.fixture(scope="module")
def references(default_int4):
    refs = References(default_int4)
    yield refs
    refs.close()


class SwitchingGovernor:
    """The engine thread's thread count from a drawn list, one entry a step (cycled): a
    switch between 1 and 2 threads in the middle of requests, as the real governor makes
    when another process takes a core."""

    def __init__(self, plan: list[int]):
        self.plan, self.step, self.current = plan, 0, plan[0]
        self.switches = 0

    def __call__(self, threads, adapt=True, **_):
        return self

    def tick(self) -> int:
        wanted = self.plan[self.step % len(self.plan)]
        self.step += 1
        if wanted != self.current:
            self.switches += 1
        self.current = wanted
        torch.set_num_threads(wanted)
        return wanted


@contextlib.contextmanager
def engine_for(loaded, kv_dtype: str, num_blocks: int, chunk: int | None, seqs: int,
               thread_plan: list[int], tier_dir: str):
    governor = SwitchingGovernor(thread_plan)
    config = EngineConfig(cache=CacheConfig(kv_dtype=kv_dtype, disk=DiskTierConfig(tier_dir, 0.25)),
                          num_blocks=num_blocks, prefill_chunk=chunk, max_step_tokens=256,
                          solo_step_tokens=256, max_num_seqs=seqs, deterministic=True)
    with mock.patch.object(engine_module, "ThreadGovernor", governor):
        engine = Engine(loaded, config).start()
    try:
        yield engine
    finally:
        engine.shutdown(grace_s=0)


def run_all(engine, requests: list[Request]):
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return assert_finished(list(pool.map(lambda r: engine.generate(r, timeout=180),
                                             requests)))


prompt_specs = st.tuples(st.integers(0, len(PREFIX_LENGTHS) - 1), st.integers(0, 20),
                         st.integers(0, 3))
schedules = st.fixed_dictionaries({
    "first": st.lists(prompt_specs, min_size=1, max_size=3),
    "then": st.lists(prompt_specs, min_size=1, max_size=3),
    "chunk": st.sampled_from([None, 16, 24, 64]),
    "seqs": st.sampled_from([1, 2, 4, 8]),
    "threads": st.lists(st.sampled_from([1, 2]), min_size=1, max_size=4),
    "num_blocks": st.sampled_from([9, 14, 24, 64]),
    "push_to_disk": st.booleans(),
    "extras": st.lists(st.sampled_from(["seeded", "duplicate", "constrained"]), max_size=3,
                       unique=True),
})


# every stress at once: preemptions (9 blocks, 8 at a time), a disk round trip, chunks of 16,
# thread switches mid-request, and all three kinds of neighbour
EVERYTHING = {"first": [(2, 20, 0), (1, 7, 1), (0, 0, 0)], "then": [(2, 20, 0), (2, 3, 2), (1, 19, 3)],
              "chunk": 16, "seqs": 8, "threads": [2, 1, 1, 2, 2], "num_blocks": 9,
              "push_to_disk": True, "extras": ["seeded", "duplicate", "constrained"]}


def check_schedule(loaded, references, compiler, kv_dtype: str, s: dict) -> dict:
    """Runs schedule ``s`` and compares every position with the references; returns what
    the schedule exercised (disk-tier hit tokens, preemptions, thread switches)."""
    vocab = loaded.config.vocab_size
    heads = prefixes(vocab)
    first = [prompt_of(p, heads, vocab) for p in s["first"]]
    then = [prompt_of(p, heads, vocab) for p in s["then"]]
    for tokens, kind in [(p, "greedy") for p in first + then] + [(then[0], "seeded")]:
        references.get(kv_dtype, tokens, kind)        # before the engine under test starts
    with tempfile.TemporaryDirectory() as tier_dir, \
            engine_for(loaded, kv_dtype, s["num_blocks"], s["chunk"], s["seqs"], s["threads"],
                       tier_dir) as engine:
        checks = []
        got = run_all(engine, [Request(p, sampling("greedy"), tenant="t", namespace="ns")
                               for p in first])
        checks += [(p, "greedy", g) for p, g in zip(first, got)]
        if s["push_to_disk"]:     # a long unrelated prompt: the first ones' blocks go to disk
            filler = [3 + i % 90 for i in range(min(BLOCK * (s["num_blocks"] - 2), 400))]
            engine.generate(Request(filler, sampling("greedy"), tenant="t",
                                    namespace="ns"), timeout=180)
        second = [Request(p, sampling("greedy"), tenant="t", namespace="ns") for p in then]
        kinds = ["greedy"] * len(then)
        if "seeded" in s["extras"]:
            second.append(Request(list(then[0]), sampling("seeded"), tenant="t", namespace="ns"))
            kinds.append("seeded")
        if "duplicate" in s["extras"]:
            second.append(Request(list(then[-1]), sampling("greedy"), tenant="t",
                                  namespace="ns"))
            kinds.append("greedy")
        extra_constrained = None
        if "constrained" in s["extras"]:
            grammar = compiler.compile(regex_grammar(r"[a-z]{2,6} [0-9]{2}"))
            extra_constrained = Request(list(first[0]), SamplingParams(
                max_tokens=8, temperature=0.0), tenant="t", namespace="ns",
                grammar=grammar.matcher())
            second.append(extra_constrained)
            kinds.append("constrained")
        got = run_all(engine, second)
        checks += [(r.tokens, k, g) for r, k, g in zip(second, kinds, got) if k != "constrained"]
        for tokens, kind, finished in checks:
            assert outcome(finished) == references.get(kv_dtype, tokens, kind), \
                (kind, len(tokens), s)
        snap = engine.request_snapshot().result(timeout=30)
        counts = engine.check_integrity().result(timeout=60)
        assert counts["free"] + counts["held"] == counts["total"], counts
        return {"disk": snap.hit_tokens["disk"], "preemptions": snap.preemptions,
                "switches": engine.thread_governor.switches}


@pytest.mark.parametrize("kv_dtype", ["float32", "int8"])
def test_logprobs_are_the_same_bits_under_every_schedule(default_int4, references, compiler,
                                                         kv_dtype):
    @settings(max_examples=3, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(schedules)
    @example(EVERYTHING)
    def fuzz(schedule):
        exercised.append(check_schedule(default_int4, references, compiler, kv_dtype, schedule))

    exercised = []
    fuzz()
    for stress in ("disk", "preemptions", "switches"):      # the schedules did stress it
        assert any(e[stress] for e in exercised), (stress, exercised)


@pytest.mark.slow
@pytest.mark.parametrize("kv_dtype", ["float32", "int8", "bfloat16"])
def test_logprobs_are_the_same_bits_under_many_schedules(default_int4, references, compiler,
                                                         kv_dtype):
    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(schedules)
    def fuzz(schedule):
        check_schedule(default_int4, references, compiler, kv_dtype, schedule)

    fuzz()


def test_a_prompt_past_three_key_chunks_gives_the_same_bits_cached_chunked_and_whole(
        default_int4, references):
    """The attention folds a query's keys in chunks of 256 positions (native_extend.c). A
    700-token prompt (three chunks) run cold in one step on the reference, and on an engine
    with the cache on that first ran its first 430 tokens, then computes the rest in chunks
    of 96 over the cached prefix, drafting while it decodes, then reads all but its last
    token from the cache (that row alone splits its chunks over workers, where one step's
    tile folded them): every generated position's top-20 logprobs are the same bits (int8
    KV, the default)."""
    rng = random.Random(SEED + 1)
    vocab = default_int4.config.vocab_size
    prompt = [rng.randrange(100, vocab) for _ in range(700)]
    want = references.get("int8", prompt, "greedy")
    config = EngineConfig(cache=CacheConfig(kv_dtype="int8"), num_blocks=128, deterministic=True,
                          max_step_tokens=96, solo_step_tokens=96, adapt_threads=False)
    engine = Engine(default_int4, config).start()
    try:
        first = Request(prompt[:430], sampling("greedy"), tenant="t", namespace="ns")
        assert_finished([engine.generate(first, timeout=120)])
        again = engine.generate(Request(list(prompt), sampling("greedy"), tenant="t",
                                        namespace="ns"), timeout=120)
        assert again.usage.cache_read_tokens >= 416, again.usage
        assert outcome(again) == want
        hit = engine.generate(Request(list(prompt), sampling("greedy"), tenant="t",
                                      namespace="ns"), timeout=120)   # its last row alone
        assert hit.usage.cache_read_tokens >= 688, hit.usage
        assert outcome(hit) == want
    finally:
        engine.shutdown(grace_s=0)
