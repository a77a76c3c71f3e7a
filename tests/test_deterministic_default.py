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
