"""The package as a user installs it: a wheel built from the checkout, installed with
``--no-deps`` into a fresh venv, run from another folder.

The fresh venv takes its dependencies (torch, aiohttp, ...) from the project's ``.venv``
through a plain path line in a ``.pth`` file: no network, and none of ``.venv``'s own
``.pth`` files run (a path line is appended to ``sys.path``, the ``.pth`` files inside that
folder are not processed), so the editable install's finder, which maps ``radixgate`` to the
checkout, is not loaded. The checkout is neither the working directory nor on
``PYTHONPATH``; ``radixgate.__file__`` proves which copy ran.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from pathlib import Path

import pytest

import radixgate
from benchmarks.launch import free_port, wait_healthy

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "README.md", "radixgate")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """The wheel's build output, its file, and a venv with it installed (module-wide)."""
    root = tmp_path_factory.mktemp("wheel")
    source = _copy_sources(root / "source")
    build = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "--no-index", "-w", str(root / "dist"), str(source)], cwd=root)
    wheel = next((root / "dist").glob("radixgate-*.whl"))
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                     cwd=root).stdout.strip())
    (site / "project_venv_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
          "--no-index", str(wheel)], cwd=root)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return {"build_log": build.stdout + build.stderr, "wheel": wheel, "venv": venv,
            "python": python, "radixgate": venv / "bin" / "radixgate", "cwd": elsewhere}


def _copy_sources(target: Path) -> Path:
    """What the build reads, copied: no stale ``build/`` of the checkout reaches the wheel,
    and tests running at once do not share one build folder."""
    target.mkdir()
    for name in BUILD_INPUTS:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, target / name)
    return target


def _clean_env() -> dict[str, str]:
    """The caller's environment without anything that would put the checkout on sys.path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP",
                        "RADIXGATE_REPO")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def test_the_wheel_builds_without_a_warning(built):
    assert "warning" not in built["build_log"].lower(), built["build_log"]


def test_the_wheel_holds_every_subpackage_and_the_package_data(built):
    names = set(zipfile.ZipFile(built["wheel"]).namelist())
    source = REPO_ROOT / "radixgate"
    for module in source.rglob("*.py"):
        assert f"radixgate/{module.relative_to(source).as_posix()}" in names
    for data in [*source.glob("gateway/static/*"), *source.glob("kernels/*.[ch]")]:
        assert f"radixgate/{data.relative_to(source).as_posix()}" in names


def test_the_runtime_dependencies_are_what_the_server_imports(built):
    metadata = zipfile.ZipFile(built["wheel"]).read(
        f"radixgate-{radixgate.__version__}.dist-info/METADATA").decode()
    runtime = [line for line in metadata.splitlines()
               if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert runtime and not [line for line in runtime if "tqdm" in line]


def test_bench_from_the_installed_package_says_where_the_suite_is(built):
    done = subprocess.run([str(built["radixgate"]), "bench", "--quick"], cwd=built["cwd"],
                          env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("radixgate bench: the benchmark suite lives in a radixgate "
                                  "source checkout"), done.stderr
    shown = _run([str(built["radixgate"]), "bench", "--repo", str(REPO_ROOT), "--help"],
                 cwd=built["cwd"]).stdout
    assert shown.startswith("usage: radixgate bench ")


def test_the_installed_copy_is_the_one_imported_not_the_checkout(built):
    shown = _run([str(built["python"]), "-c", "import radixgate; print(radixgate.__file__)"],
                 cwd=built["cwd"]).stdout.strip()
    assert Path(shown).is_relative_to(built["venv"]), shown


def test_version_is_the_packages_one_version_string(built):
    shown = _run([str(built["radixgate"]), "--version"], cwd=built["cwd"]).stdout.strip()
    metadata = _run([str(built["python"]), "-c",
                     "import importlib.metadata as m; print(m.version('radixgate'))"],
                    cwd=built["cwd"]).stdout.strip()
    assert shown == f"radixgate {radixgate.__version__}"
    assert metadata == radixgate.__version__


def test_the_installed_server_starts_from_another_folder_and_answers(built):
    port = free_port()
    log = built["cwd"] / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(built["radixgate"]), "serve", "--tiny", "--port", str(port),
                                 "--kv-cache-gb", "0.002", "--max-model-len", "256"],
                                cwd=built["cwd"], env=_clean_env(), stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(proc, base, 120, lambda: log.read_text(errors="replace")[-4000:])
        with urllib.request.urlopen(base + "/v1/models", timeout=10) as reply:
            model = json.load(reply)["data"][0]["id"]
        body = json.dumps({"model": model, "max_tokens": 4, "temperature": 0,
                           "messages": [{"role": "user", "content": "hello"}]}).encode()
        request = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as reply:
            answer = json.load(reply)
        assert answer["choices"][0]["message"]["role"] == "assistant"
        assert answer["usage"]["completion_tokens"] >= 1
        with urllib.request.urlopen(base + "/dashboard", timeout=10) as page:
            assert b"<html" in page.read().lower()       # the package data came along
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
