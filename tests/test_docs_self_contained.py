"""The project stands alone: nothing in it cites a document outside the repository (the
design notes it started from are not part of it), and every relative link in its
Markdown points at a file that is there."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\b(DESIGN|STYLE)\.md\b|\.\./shared\b|\bshared/(DESIGN|STYLE|hooks)")
TEXT_SUFFIXES = {".py", ".md", ".js", ".html", ".css", ".toml", ".txt", ".cfg", ".ini", ".sh"}
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def project_files() -> list[Path]:
    """The files git tracks, or every file when this is not a git checkout."""
    try:
        names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
        files = [ROOT / name for name in names]
    except (OSError, subprocess.CalledProcessError):
        files = [p for p in ROOT.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts]
    return [p for p in files if p.is_file() and (p.suffix in TEXT_SUFFIXES
                                                  or p.name in {"Makefile", "run"})]


def test_no_file_cites_a_document_outside_the_repository():
    this = Path(__file__).resolve()
    citing = [f"{p.relative_to(ROOT)}:{n}" for p in project_files() if p.resolve() != this
              for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
              if OUTSIDE.search(line)]
    assert len(project_files()) > 100
    assert citing == []


def test_relative_markdown_links_point_at_files_in_the_repository():
    broken = []
    for doc in (p for p in project_files() if p.suffix == ".md"):
        for target in MD_LINK.findall(doc.read_text(errors="replace")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert broken == []
