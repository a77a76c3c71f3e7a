"""The ``radixgate`` command line: flags over the config file, the loopback guard, CPU
threads (flag, env, config), generate with cache reuse, the plan command, refusals before
anything loads (a port in use, a missing model), ``--version``, ``bench`` from any folder,
one "draining" at shutdown, and what the stats say about budgets with replicas."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.launch import free_port, radixgate_command
from radixgate.gateway.cli import build_parser, config_from_args, main
from radixgate.gateway.config import ConfigError, config_from_dict
from radixgate.kv import CacheConfig, CreditParams
from tests.support.server import ServerProcess, ServerSpec


def _env_without_repo() -> dict[str, str]:
    """The environment without PYTHONPATH: the command finds the checkout on its own."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RADIXGATE_REPO")}


def test_flags_override_the_config_file(tmp_path):
    path = tmp_path / "radixgate.toml"
    path.write_text('[server]\nport = 9000\nhost = "127.0.0.1"\n[cache]\nblock_size = 32\n'
                    'kv_cache_gb = 2\npolicy = "lru"\n')
    args = build_parser().parse_args(["serve", "--config", str(path), "--port", "9100",
                                      "--kv-cache-gb", "0.5", "--tiny", "--max-model-len", "1024",
                                      "--policy", "credit"])
    cfg = config_from_args(args)
    assert (cfg.server.port, cfg.server.host) == (9100, "127.0.0.1")
    assert cfg.cache.block_size == 32 and cfg.cache.kv_cache_gb == 0.5
    assert cfg.cache.policy == "credit"
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


@pytest.fixture
def torch_threads():
    """Restores torch's thread count (process-wide) after a test that sets it."""
    import torch
    before = torch.get_num_threads()
    yield torch
    torch.set_num_threads(before)


def test_threads_flag_beats_env_which_beats_the_config(tmp_path, monkeypatch):
    path = tmp_path / "radixgate.toml"
    path.write_text("[model]\nthreads = 3\n")
    parse = lambda *flags: config_from_args(  # noqa: E731
        build_parser().parse_args(["serve", "--config", str(path), *flags]))
    monkeypatch.delenv("RADIXGATE_THREADS", raising=False)
    assert parse().model.threads == 3
    assert config_from_args(build_parser().parse_args(["serve"])).model.threads == 0
    monkeypatch.setenv("RADIXGATE_THREADS", "2")
    assert parse().model.threads == 2
    assert parse("--threads", "1").model.threads == 1
    generate = build_parser().parse_args(["generate", "x", "--threads", "4"])
    assert config_from_args(generate).model.threads == 4


def test_bad_thread_counts_are_clean_errors(monkeypatch, capsys):
    monkeypatch.setenv("RADIXGATE_THREADS", "many")
    assert main(["serve", "--tiny"]) == 2
    assert "RADIXGATE_THREADS" in capsys.readouterr().err
    monkeypatch.delenv("RADIXGATE_THREADS")
    assert main(["serve", "--tiny", "--threads", "-1"]) == 2
    assert "threads" in capsys.readouterr().err


def test_set_cpu_threads_applies_to_every_thread_and_zero_keeps_the_default(torch_threads):
    import threading

    from radixgate.runtime.engine.cpu_threads import set_cpu_threads
    assert set_cpu_threads(0) == torch_threads.get_num_threads()      # unchanged
    assert set_cpu_threads(1) == 1
    seen = []
    worker = threading.Thread(target=lambda: seen.append(torch_threads.get_num_threads()))
    worker.start()
    worker.join()
    assert seen == [1]                       # the engine runs in its own thread


def test_generate_prints_text_and_usage_and_reuses_the_cache(capsys, torch_threads):
    torch_threads.set_num_threads(2)
    code = main(["generate", "The radix tree stores prefixes of prompts", "--tiny", "--chat",
                 "--max-tokens", "3", "--repeat", "2", "--kv-cache-gb", "0.01", "--threads", "1"])
    assert code == 0
    assert torch_threads.get_num_threads() == 1
    usage = re.findall(r"\[usage\] prompt=(\d+) cached=(\d+) uncached=(\d+) output=(\d+)",
                       capsys.readouterr().out)
    assert len(usage) == 2
    (p1, c1, u1, o1), (p2, c2, u2, o2) = [tuple(map(int, u)) for u in usage]
    assert p1 == p2 and c1 == 0 and c2 == p2 - 1 and u2 == 1
    assert 1 <= o1 <= 3 and 1 <= o2 <= 3


def test_plan_prints_the_planners_table(capsys):
    assert main(["plan", "default", "--memory-gb", "1", "--context", "2048"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["model", "KV/token"] and len(lines) == 3
    assert "22.5 KiB" in lines[2] and "1 GiB" in lines[2]       # SmolLM2-135M at 2 bytes


@pytest.mark.parametrize("command, flag", [("plan", "--memory-gb"), ("bench", "--quick")])
def test_help_of_plan_and_bench_lists_their_own_flags(command, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert flag in capsys.readouterr().out


def test_unknown_subcommand_exits_with_usage():
    with pytest.raises(SystemExit):
        main(["frobnicate"])


def test_policy_flag_and_its_deprecated_plain_lru_spelling_reach_the_engine():
    from radixgate.gateway.state import engine_config
    default = config_from_args(build_parser().parse_args(["serve"]))
    lru = config_from_args(build_parser().parse_args(["serve", "--policy", "lru"]))
    with pytest.warns(FutureWarning, match="--plain-lru is deprecated"):
        plain = config_from_args(build_parser().parse_args(["serve", "--plain-lru"]))
    assert engine_config(default).cache == CacheConfig()
    assert engine_config(lru).cache.policy == engine_config(plain).cache.policy == "lru"
    with pytest.raises(ConfigError, match="contradicts"), pytest.warns(FutureWarning):
        config_from_args(build_parser().parse_args(["serve", "--plain-lru", "--policy", "credit"]))


def test_cache_section_reaches_the_engine_as_one_frozen_config(tmp_path):
    from radixgate.gateway.state import engine_config
    path = tmp_path / "radixgate.toml"
    path.write_text('[cache]\nkv_cache_gb = 0.5\nblock_size = 32\npolicy = "credit"\n'
                    "[cache.credit]\ncontinuation_ticks = 50\nbranch_ticks = 8\n"
                    "probation_ticks = 0\npartial_tails_first = false\n")
    config = config_from_args(build_parser().parse_args(["serve", "--config", str(path)]))
    assert engine_config(config).cache is config.cache
    assert config.cache == CacheConfig(
        kv_cache_gb=0.5, block_size=32, policy="credit", credit=CreditParams(
            continuation_ticks=50, branch_ticks=8, probation_ticks=0, partial_tails_first=False))


def test_old_model_cache_keys_still_work_with_a_deprecation_warning_per_key(tmp_path):
    path = tmp_path / "radixgate.toml"
    path.write_text("[model]\nkv_cache_gb = 0.5\nblock_size = 32\nbranch_ticks = 8\n"
                    "partial_tails_first = false\nmax_model_len = 1024\n")
    with pytest.warns(FutureWarning) as record:
        config = config_from_args(build_parser().parse_args(["serve", "--config", str(path)]))
    moved = sorted(re.search(r"\[model\] (\w+) is deprecated", str(w.message)).group(1)
                   for w in record)
    assert moved == ["block_size", "branch_ticks", "kv_cache_gb", "partial_tails_first"]
    assert "[cache.credit] branch_ticks" in " ".join(str(w.message) for w in record)
    assert config.cache == CacheConfig(kv_cache_gb=0.5, block_size=32, credit=CreditParams(
        branch_ticks=8, partial_tails_first=False))
    assert config.model.max_model_len == 1024


def test_an_old_key_and_its_new_place_both_set_is_an_error():
    with pytest.raises(ConfigError, match=r"\[model\] block_size and \[cache\] block_size"):
        config_from_dict({"model": {"block_size": 32}, "cache": {"block_size": 16}})


@pytest.mark.parametrize("cache, fragment", [
    ({"disk": {"dir": "/tmp/kv"}}, "cache.disk dir and gb go together"),
    ({"disk": {"gb": 10.0}}, "cache.disk dir and gb go together"),
    ({"disk": {"dir": "/tmp/kv", "gb": 1.0}, "page_rounded_match": True}, "token-exact"),
    ({"disk": {"dir": "/tmp/kv", "gb": 1.0}, "enable_prefix_cache": False}, "prefix cache"),
    ({"policy": "lru", "credit": {"branch_ticks": 8}}, "applies to policy"),
])
def test_incomplete_or_unread_cache_settings_are_refused_not_ignored(cache, fragment):
    with pytest.raises(ConfigError, match=fragment):
        config_from_dict({"cache": cache})


def test_the_disk_tier_flags_and_cache_keys_reach_the_cache_config(tmp_path, monkeypatch):
    from radixgate.runtime.engine.engine_config import EngineConfig
    monkeypatch.setenv("HOME", str(tmp_path))
    flags = config_from_args(build_parser().parse_args(
        ["serve", "--kv-disk-dir", "~/kv", "--kv-disk-gb", "2.5"]))
    assert flags.cache.disk.dir == str(tmp_path / "kv") and flags.cache.disk.gb == 2.5
    path = tmp_path / "radixgate.toml"
    path.write_text('[cache.disk]\ndir = "/srv/kv"\ngb = 4\n')
    from_file = config_from_args(build_parser().parse_args(["serve", "--config", str(path)]))
    assert (from_file.cache.disk.dir, from_file.cache.disk.budget_bytes) == ("/srv/kv", 4 << 30)
    assert EngineConfig(cache=from_file.cache).cache.disk.gb == 4
    assert EngineConfig(cache=CacheConfig(kv_dtype="fp8")).cache.kv_dtype == "fp8"


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "float16", "int8", "fp8"])
def test_kv_dtype_flag_and_cache_key_reach_the_cache_config(tmp_path, kv_dtype):
    flag = config_from_args(build_parser().parse_args(["serve", "--kv-dtype", kv_dtype]))
    assert flag.cache.kv_dtype == kv_dtype
    path = tmp_path / "radixgate.toml"
    path.write_text(f'[cache]\nkv_dtype = "{kv_dtype}"\n')
    assert config_from_args(build_parser().parse_args(["serve", "--config", str(path)])
                            ).cache.kv_dtype == kv_dtype


def test_serve_exits_with_status_1_and_the_reason_when_the_model_fails_to_load(tmp_path):
    """The model loads on a thread started before the web stack (early_engine_factory):
    its failure still reaches the server, which exits 1 with one line saying why."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    done = _serve(["--model", str(broken), "--port", str(free_port())], cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "exiting: " in done.stderr and "model load failed" in done.stderr


def _serve(args: list[str], cwd, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "radixgate.gateway.cli", "serve", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)


def _one_line_refusal(done: subprocess.CompletedProcess) -> str:
    """A refusal before anything loads: exit status 2, one line on stderr, no model log."""
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "loaded" not in done.stderr
    return lines[0]


def test_a_model_path_that_does_not_exist_is_one_line_and_status_2_before_loading(tmp_path):
    missing = tmp_path / "missing.gguf"
    line = _one_line_refusal(_serve(["--model", str(missing), "--port", str(free_port())],
                                    cwd=tmp_path))
    assert line == f"radixgate: model path {missing} does not exist (--model or [model] path)"


def test_a_port_in_use_is_one_line_and_status_2_before_loading(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        line = _one_line_refusal(_serve(["--tiny", "--port", str(port)], cwd=tmp_path))
    assert line.startswith(f"radixgate: cannot listen on 127.0.0.1:{port}: ")
    assert "in use" in line


def test_the_port_check_lets_a_free_port_through():
    from radixgate.gateway.cli_preflight import check_port_free
    check_port_free("127.0.0.1", free_port())
    with pytest.raises(ConfigError, match="cannot listen on no-such-host.invalid"):
        check_port_free("no-such-host.invalid", 8080)


def test_version_is_the_packages_version_string(capsys):
    import radixgate
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"radixgate {radixgate.__version__}"


@pytest.mark.parametrize("flags", [["--memory-gb", "0"], ["--memory-gb", "-1"],
                                   ["--context", "0"], ["--context", "-8"],
                                   ["--conversations", "0"], ["--dtype-bytes", "0"],
                                   ["--window-ratio", "-0.5"], ["--memory-gb", "nan"]])
def test_plan_refuses_budgets_and_contexts_of_zero_or_less(flags, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "default", *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: radixgate plan") and flags[0] in err


def test_plan_says_why_a_model_with_every_layer_windowed_has_no_kv_per_token(capsys):
    assert main(["plan", "mistral-7b", "--context", "32768"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = lines[2].split()
    assert row[:3] == ["mistral-7b", "0", "B*"]
    assert lines[3].startswith("* mistral-7b: every layer has a 4,096-token sliding window")
    assert "last 4,112 tokens in the window pool" in lines[3]
    assert main(["plan", "mistral-7b", "--context", "2048"]) == 0      # the window spans it
    assert "*" not in capsys.readouterr().out


def test_bench_runs_from_another_folder_with_its_own_usage_line(tmp_path):
    done = subprocess.run([*radixgate_command(), "bench", "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=_env_without_repo())
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: radixgate bench ") and "--quick" in done.stdout


def test_bench_finds_the_checkout_by_flag_env_or_the_working_folder(tmp_path, monkeypatch):
    from radixgate.gateway import cli_bench
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setattr(cli_bench.radixgate, "__file__", str(tmp_path / "site" / "radixgate" /
                                                             "__init__.py"))
    monkeypatch.delenv(cli_bench.REPO_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(cli_bench.CheckoutNotFound, match="--repo DIR or set RADIXGATE_REPO"):
        cli_bench.find_checkout()
    assert cli_bench.find_checkout(str(repo)) == repo
    with pytest.raises(cli_bench.CheckoutNotFound, match="not a radixgate source checkout"):
        cli_bench.find_checkout(str(tmp_path))
    monkeypatch.setenv(cli_bench.REPO_ENV, str(repo))
    assert cli_bench.find_checkout() == repo
    monkeypatch.delenv(cli_bench.REPO_ENV)
    monkeypatch.chdir(repo / "docs")
    assert cli_bench.find_checkout() == repo                     # a parent of the working folder
    assert cli_bench.split_repo_flag(["--repo", "x", "--quick"]) == ("x", ["--quick"])
    assert cli_bench.split_repo_flag(["--repo=x"]) == ("x", [])


def test_bench_outside_a_checkout_is_one_line_and_status_2(tmp_path, monkeypatch, capsys):
    from radixgate.gateway import cli_bench
    monkeypatch.setattr(cli_bench.radixgate, "__file__", str(tmp_path / "radixgate" /
                                                             "__init__.py"))
    monkeypatch.delenv(cli_bench.REPO_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("radixgate bench: the benchmark suite lives in")


def test_sigterm_logs_draining_once_and_the_server_exits_0(tmp_path):
    server = ServerProcess(ServerSpec()).start()
    try:
        server.send_sigterm()
        assert server.wait(60) == 0
    finally:
        server.kill()
    log = server.log_path.read_text(errors="replace")
    assert log.count("draining:") == 1, log[-3000:]
    assert re.search(r"engine ready: .* \d+ KV blocks of 16 tokens", log)


def test_stats_say_memory_is_each_replicas_and_the_disk_budget_is_split():
    from dataclasses import fields, replace

    from radixgate.gateway.cache_stats import build_stats
    from radixgate.gateway.usage_book import UsageBook
    from radixgate.runtime.engine.snapshot import BlockCounts, ReplicaCounts, empty_snapshot
    from radixgate.kv.tiers.disk.tier import TierStats
    each = BlockCounts(total=100, free=100, cached=0, pinned=0, in_use=0)
    tier = TierStats(**{f.name: 0 for f in fields(TierStats)}
                     | {"kind": "disk", "folder": "/kv", "budget_bytes": 2 << 30, "drops": {}})
    snap = replace(empty_snapshot(200, 16), kv_bytes_per_token=512, tier=tier,
                   replicas=(ReplicaCounts("r0", each, 0.0, 0, 0),
                             ReplicaCounts("r1", each, 0.0, 0, 0)))
    stats = build_stats(snap, UsageBook(), model="m", tenant=None, decode=None)
    assert stats["capacity"]["replicas"] == 2
    assert stats["capacity"]["bytes_per_replica"] * 2 == stats["capacity"]["bytes"]
    disk = stats["tiers"]["disk"]
    assert disk["budget_bytes"] == 2 << 30 and disk["budget_bytes_per_replica"] == 1 << 30


def test_deterministic_flag_and_model_key_reach_the_engine_and_its_replicas(tmp_path):
    import dataclasses

    from radixgate.gateway.state import engine_config
    path = tmp_path / "radixgate.toml"
    path.write_text("[model]\ndeterministic = true\n")
    from_file = config_from_args(build_parser().parse_args(["serve", "--config", str(path)]))
    assert from_file.model.deterministic and engine_config(from_file).deterministic
    replica = dataclasses.replace(engine_config(from_file), kv_events_endpoint=None)
    assert replica.deterministic          # what radixgate/gateway/scaleout.py hands each replica
    off = config_from_args(build_parser().parse_args(
        ["serve", "--config", str(path), "--no-deterministic"]))
    assert not off.model.deterministic and not engine_config(off).deterministic
    assert config_from_args(build_parser().parse_args(["serve", "--deterministic"])) \
        .model.deterministic
    assert not config_from_args(build_parser().parse_args(["serve"])).model.deterministic


def test_a_deterministic_engine_refuses_to_start_without_the_native_kernels(monkeypatch):
    from radixgate.kernels import native
    from radixgate.runtime.engine.engine import Engine
    from radixgate.runtime.engine.engine_config import EngineConfig
    from tests.support.engine import tiny_model
    monkeypatch.setattr(native, "usable", lambda *tensors: False)
    with pytest.raises(ValueError, match="deterministic mode needs the native CPU kernels"):
        Engine(tiny_model(), EngineConfig(num_blocks=16, deterministic=True))


def test_counts_in_log_lines_agree_with_their_nouns():
    from radixgate.plural import plural
    assert [plural(n, "block") for n in (0, 1, 2, 1200)] == [
        "0 blocks", "1 block", "2 blocks", "1,200 blocks"]
    assert plural(1, "KV block") == "1 KV block" and plural(3, "entry", "entries") == "3 entries"
