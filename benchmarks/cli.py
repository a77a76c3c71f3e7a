"""The command line every benchmark shares: ``--quick`` / ``--full`` (one of them; which one
is the default is the benchmark's), ``--out FOLDER``, and the JSON result written there.

    parser = size_parser(__doc__, quick="fewer repetitions", full="the default sizes")
    parser.add_argument(...)                 # the benchmark's own flags
    args = parser.parse_args(argv)
    result = run(quick=args.quick)
    write_result(args.out, "radix_ops.json", result)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

OUT_DIR = Path(__file__).parent / "out"     # the checkout's benchmarks/out, from any folder


def size_parser(doc: str | None, quick: str, full: str | None = None,
                default: str = "full", out: Path = OUT_DIR) -> argparse.ArgumentParser:
    """A parser with ``--quick`` and (when ``full`` describes it) ``--full``, mutually
    exclusive; ``args.quick`` is True for a quick run, also when ``default`` is "quick" and
    neither is given. ``--out``: the folder for the result (``out`` by default)."""
    parser = argparse.ArgumentParser(description=(doc or "").strip().split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mark = lambda name: " (default)" if default == name else ""   # noqa: E731
    mode.add_argument("--quick", action="store_true", default=default == "quick",
                      help=quick + mark("quick"))
    if full is not None:
        mode.add_argument("--full", action="store_false", dest="quick",
                          help=full + mark("full"))
    parser.add_argument("--out", type=Path, default=out, help="folder for the JSON result")
    return parser


def write_result(out: Path, name: str, result, indent: int = 2) -> Path:
    """``result`` as JSON in ``out/name`` (the folder made if needed); returns the path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(result, indent=indent))
    return path
