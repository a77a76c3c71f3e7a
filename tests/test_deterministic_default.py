"""The deterministic mode is the default where it holds (``resolve_deterministic``): a model
that can give it runs in it unless told not to, one that cannot runs without it and says so,
and ``--deterministic`` refuses to start there (docs/ARCHITECTURE.md section 5c)."""
from __future__ import annotations

import logging

import pytest

from radixgate.gateway.cli import build_parser, config_from_args
from radixgate.runtime.engine.core import resolve_deterministic
from radixgate.runtime.engine.engine import Engine
from radixgate.runtime.engine.engine_config import EngineConfig


class _Model:
    def __init__(self, reason: str | None):
        self.reason = reason

    def check_deterministic(self) -> None:
        if self.reason:
            raise ValueError(self.reason)


def test_the_default_takes_it_where_it_holds_and_says_which(caplog):
    caplog.set_level(logging.INFO, "radixgate.runtime.engine.core")
    assert resolve_deterministic(_Model(None), None) is True
    assert "deterministic mode on" in caplog.text
    caplog.clear()
    assert resolve_deterministic(_Model("head dims"), None) is False
    assert "deterministic mode unavailable (head dims)" in caplog.text


def test_asked_for_it_refuses_where_it_cannot_hold_and_off_is_off():
    with pytest.raises(ValueError, match="head dims"):
        resolve_deterministic(_Model("head dims"), True)
    assert resolve_deterministic(_Model(None), True) is True
    assert resolve_deterministic(_Model(None), False) is False


def test_an_engine_with_the_default_config_steps_deterministically(tiny_model):
    engine = Engine(tiny_model, EngineConfig())
    try:
        assert EngineConfig().deterministic is None and engine.core.deterministic is True
    finally:
        engine.shutdown()


@pytest.mark.parametrize("flags, want", [([], None), (["--deterministic"], True),
                                         (["--no-deterministic"], False)])
def test_the_cli_leaves_it_to_the_engine_unless_told(flags, want):
    config = config_from_args(build_parser().parse_args(["serve", "--tiny", *flags]))
    assert config.model.deterministic is want


def test_the_default_engine_picks_int8_kv_and_a_chunked_prompt_answers_as_a_whole_one(
        make_engine):
    """The default KV dtype in the mode is int8 (``resolve_kv_dtype``). A prompt cut into
    chunks whose logits nobody reads (the head then sees no rows: it raised, a 500 for any
    prompt longer than a step over the tiny model's dense head) answers with the same tokens
    and logprobs as the prompt in one step."""
    from radixgate.runtime.engine.api import Request, SamplingParams
    prompt = [(7 * i) % 400 + 5 for i in range(300)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=0)
    answers = []
    for step in (64, 512):
        engine = make_engine(max_step_tokens=step, solo_step_tokens=step, num_blocks=64)
        assert engine.core.kv.kv_dtype == "int8" and engine.core.deterministic
        answers.append(engine.generate(Request(prompt, params)))
    chunked, whole = answers
    assert chunked.output_token_ids == whole.output_token_ids and len(whole.output_token_ids) == 6
    assert chunked.logprobs == whole.logprobs and len(whole.logprobs) == 6


def test_auto_kv_is_int8_only_where_the_mode_holds_on_the_cpu():
    import torch
    from radixgate.runtime.model.kv_cache import resolve_kv_dtype
    assert resolve_kv_dtype("auto", torch.float32, "cpu", deterministic=True) == "int8"
    assert resolve_kv_dtype("auto", torch.float32, "cpu", deterministic=False) == "float32"
    assert resolve_kv_dtype("auto", torch.bfloat16, "cpu", deterministic=True) == "bfloat16"
    assert resolve_kv_dtype("float32", torch.float32, "cpu", deterministic=True) == "float32"
