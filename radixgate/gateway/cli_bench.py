"""``radixgate bench``: the benchmark suite of a source checkout, from any folder.

The suite (the checkout's ``benchmarks/`` folder) is not part of the installed package. The
checkout is the first of: ``--repo DIR`` (before the suite's own flags), env
``RADIXGATE_REPO``, the checkout this package runs from (an editable install), the working
folder or one of its parents. Found, it goes first on ``sys.path`` and on ``PYTHONPATH`` (the
suite starts ``python -m benchmarks.<name>`` subprocesses); not found, one line on stderr
says where to point and the exit status is 2. The suite's own flags and ``--help`` are its
parser's, shown as ``radixgate bench``.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import radixgate

REPO_ENV = "RADIXGATE_REPO"
PROG = "radixgate bench"
SUITE = "benchmarks.run_all"
HELP = ("the benchmark suite of a radixgate source checkout (not part of the installed "
        "package): --repo DIR or env RADIXGATE_REPO names the checkout; default: the one "
        "this package runs from, else the working folder or a parent. The suite's flags: "
        "radixgate bench --help")


class CheckoutNotFound(Exception):
    """No radixgate source checkout with the benchmark suite where the user pointed, or
    none found."""


def bench_command(argv: list[str]) -> int:
    """Runs the suite's ``main`` with ``argv`` (less ``--repo``); returns the exit status."""
    try:
        repo, rest = split_repo_flag(argv)
        root = find_checkout(repo)
    except CheckoutNotFound as exc:
        print(f"radixgate bench: {exc}", file=sys.stderr)
        return 2
    put_on_path(root)
    suite = importlib.import_module(SUITE)
    program, sys.argv[0] = sys.argv[0], PROG      # argparse's prog: basename(sys.argv[0])
    try:
        return int(suite.main(rest) or 0)
    finally:
        sys.argv[0] = program


def split_repo_flag(argv: list[str]) -> tuple[str | None, list[str]]:
    """``--repo DIR`` / ``--repo=DIR`` at the front of ``argv``, and the rest."""
    if argv and argv[0].startswith("--repo="):
        return argv[0].split("=", 1)[1], argv[1:]
    if argv and argv[0] == "--repo":
        if len(argv) < 2:
            raise CheckoutNotFound("--repo needs a folder")
        return argv[1], argv[2:]
    return None, argv


def find_checkout(repo: str | None = None) -> Path:
    """The source checkout whose ``benchmarks/`` to run (the order in the module docstring)."""
    named = repo or os.environ.get(REPO_ENV)
    if named:
        root = Path(named).expanduser().resolve()
        if not is_checkout(root):
            raise CheckoutNotFound(f"{root} is not a radixgate source checkout "
                                   f"(no benchmarks/run_all.py there)")
        return root
    own = Path(radixgate.__file__).resolve().parents[1]
    cwd = Path.cwd().resolve()
    for root in (own, cwd, *cwd.parents):
        if is_checkout(root):
            return root
    raise CheckoutNotFound(
        "the benchmark suite lives in a radixgate source checkout, not in the installed "
        f"package: run this inside a checkout, or pass --repo DIR or set {REPO_ENV}")


def is_checkout(root: Path) -> bool:
    return (root / "benchmarks" / "run_all.py").is_file() and (root / "radixgate").is_dir()


def put_on_path(root: Path) -> None:
    """``root`` first on this process's ``sys.path`` and on its children's ``PYTHONPATH``."""
    if str(root) in sys.path:
        sys.path.remove(str(root))
    sys.path.insert(0, str(root))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(root)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *rest])
