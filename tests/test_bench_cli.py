"""The benchmarks' shared command line (benchmarks/cli.py): --quick and --full exclude each
other, each benchmark's default holds, and the result lands as JSON in --out."""
from __future__ import annotations

import json

import pytest

from benchmarks.cli import size_parser, write_result


def test_quick_and_full_choose_the_size_and_exclude_each_other():
    parser = size_parser("A benchmark.\n\nMore.", quick="small", full="big")
    assert parser.parse_args([]).quick is False
    assert parser.parse_args(["--quick"]).quick is True
    assert parser.parse_args(["--full"]).quick is False
    assert parser.description == "A benchmark."
    with pytest.raises(SystemExit):
        parser.parse_args(["--quick", "--full"])


def test_a_quick_by_default_benchmark_runs_full_only_when_asked(tmp_path):
    parser = size_parser(None, quick="small", full="big", default="quick", out=tmp_path)
    assert parser.parse_args([]).quick is True
    assert parser.parse_args(["--full"]).quick is False
    assert parser.parse_args([]).out == tmp_path


def test_the_result_is_written_as_json_in_the_out_folder(tmp_path):
    path = write_result(tmp_path / "new", "x.json", {"ratio": 0.98})
    assert path == tmp_path / "new" / "x.json" and json.loads(path.read_text()) == {"ratio": 0.98}
