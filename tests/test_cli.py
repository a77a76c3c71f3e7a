"""The ``radixgate`` command line: flags over the config file, the loopback guard, generate
with cache reuse, plan delegation."""
from __future__ import annotations

import re

import pytest

from radixgate.gateway.cli import build_parser, config_from_args, main


def test_flags_override_the_config_file(tmp_path):
    path = tmp_path / "radixgate.toml"
    path.write_text('[server]\nport = 9000\nhost = "127.0.0.1"\n[model]\nblock_size = 32\n'
                    'kv_cache_gb = 2\n')
    args = build_parser().parse_args(["serve", "--config", str(path), "--port", "9100",
                                      "--kv-cache-gb", "0.5", "--tiny", "--max-model-len", "1024"])
    cfg = config_from_args(args)
    assert (cfg.server.port, cfg.server.host) == (9100, "127.0.0.1")
    assert cfg.model.block_size == 32 and cfg.model.kv_cache_gb == 0.5
    assert cfg.model.tiny and cfg.model.max_model_len == 1024


def test_defaults_are_the_default_model_on_loopback_8080():
    cfg = config_from_args(build_parser().parse_args(["serve"]))
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8080)
    assert cfg.model.path == "default" and not cfg.model.tiny


def test_serve_without_keys_refuses_a_public_host(capsys):
    assert main(["serve", "--host", "0.0.0.0", "--tiny"]) == 2
    assert "non-loopback" in capsys.readouterr().err


def test_bad_config_file_is_a_clean_error(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text("[server]\nport = 'eighty'\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert "server" in capsys.readouterr().err.lower()


def test_generate_prints_text_and_usage_and_reuses_the_cache(capsys):
    code = main(["generate", "The radix tree stores prefixes of prompts", "--tiny", "--chat",
                 "--max-tokens", "3", "--repeat", "2", "--kv-cache-gb", "0.01"])
    assert code == 0
    usage = re.findall(r"\[usage\] prompt=(\d+) cached=(\d+) uncached=(\d+) output=(\d+)",
                       capsys.readouterr().out)
    assert len(usage) == 2
    (p1, c1, u1, o1), (p2, c2, u2, o2) = [tuple(map(int, u)) for u in usage]
    assert p1 == p2 and c1 == 0 and c2 == p2 - 1 and u2 == 1
    assert 1 <= o1 <= 3 and 1 <= o2 <= 3


def test_plan_delegates_to_the_planner(capsys):
    assert main(["plan", "default", "--memory-gb", "1", "--context", "2048"]) == 0
    assert capsys.readouterr().out.strip()


def test_unknown_subcommand_exits_with_usage():
    with pytest.raises(SystemExit):
        main(["frobnicate"])
