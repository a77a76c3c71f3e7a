"""Every subcommand's ``--help`` as a user reads it: its own usage line, a sentence and a
default for every flag, plain text (no reStructuredText markup, no source file names)."""
from __future__ import annotations

import argparse
import re

import pytest

from radixgate.gateway.cli import build_parser, main

SUBCOMMANDS = ("serve", "generate", "plan", "bench")
# flags whose help is another helper's to word (Ray/replica security); checked for the rest


def _help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _flag_actions(command: str) -> list[argparse.Action]:
    if command == "bench":
        from benchmarks.run_all import build_parser as bench_parser
        parser = bench_parser()
    else:
        parser = _subparsers()[command]
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_the_usage_line_names_the_subcommand(command, capsys):
    assert _help_text(command, capsys).startswith(f"usage: radixgate {command} ")


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_the_help_is_plain_text_without_source_file_names(command, capsys):
    text = _help_text(command, capsys)
    assert "``" not in text and ":func:" not in text and ":class:" not in text
    assert not re.search(r"\b[\w/]+\.py\b", text), text


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_flag_has_a_sentence_and_its_default(command):
    for action in _flag_actions(command):
        name = action.option_strings[0] if action.option_strings else action.dest
        text = action.help or ""
        assert text and text is not argparse.SUPPRESS and len(text.split()) >= 3, name
        if not action.option_strings:
            continue
        assert "default" in text, f"{command} {name}: {text}"
        if isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
            assert f"{action.default:g}" in text.replace(",", ""), f"{command} {name}: {text}"


def test_the_top_level_help_lists_every_subcommand_and_the_version(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert all(command in text for command in SUBCOMMANDS) and "--version" in text
    assert "``" not in text and not re.search(r"\b[\w/]+\.py\b", text)


def test_replicas_split_the_disk_budget_but_not_the_memory_one(capsys):
    text = " ".join(_help_text("serve", capsys).split())
    assert "each replica's own budget" in text                      # --kv-cache-gb
    assert "split evenly" in text                                    # --kv-disk-gb


def test_spec_help_says_what_holds_outside_the_deterministic_mode(capsys):
    text = " ".join(_help_text("serve", capsys).split())
    assert "the answer is what it would be without" not in text
    assert "In the deterministic mode (the default) the tokens and logprobs are those it gives "\
           "without drafts" in text
