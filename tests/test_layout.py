"""Layout rules the code keeps (static, with ``ast``; imports nothing it checks):

- no module imports another module's underscore name (``from x import _name``) or reaches
  into an imported module (``module._name``); in ``radixgate/kv/`` no code touches another
  object's underscore attribute at all (``other._name``: only ``self``/``cls`` may);
- the modules of ``radixgate/kv/`` import no cycle (module-level imports; those under
  ``if TYPE_CHECKING:`` aside).

Import cycles across the whole package are checked by tests/test_import_graph.py (grimp).
"""
from __future__ import annotations

import ast
import sys
import importlib.util
from pathlib import Path

import pytest

from tests.support.graphs import import_cycles

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("kv/core", "kv", "runtime", "cluster", "gateway", "kernels", "benchmarks")
PACKAGE = "radixgate"



def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def modules(folder: str) -> list[Path]:
    """The modules of a package folder (``radixgate/<folder>``) or of ``benchmarks/``."""
    base = ROOT if folder == "benchmarks" else ROOT / PACKAGE
    return sorted((base / folder).rglob("*.py"))


def module_name(path: Path) -> str:
    """``radixgate.<folder>.<sub>`` for a file under one of the package's folders."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == PACKAGE else [PACKAGE, *parts])


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names."""
    if not node.level:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package.pop()
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def violations(path: Path, strict: bool) -> list[str]:
    """Underscore names of other modules (and, when ``strict``, of other objects) used
    in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    where = str(path.relative_to(ROOT))
    found = []
    imported: set[str] = set()      # names bound to other modules' objects by imports
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{where}: imports {alias.name} from {_resolve(path, node)}")
                imported.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(_private(part) for part in alias.name.split(".")):
                    found.append(f"{where}: imports {alias.name}")
                imported.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in imported:
            found.append(f"{where}: {owner.id}.{node.attr} of an imported module")
        elif strict and not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
            found.append(f"{where}: {ast.unparse(owner)}.{node.attr} of another object")
    return found


def module_imports(path: Path, known: set[str]) -> set[str]:
    """Modules of ``known`` that ``path`` imports at module level (TYPE_CHECKING aside);
    ``from package import module`` names the module, not the package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and not _is_type_checking(node):
            pending.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(path, node)
            for alias in node.names:
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names & known


def import_graph(folder: str) -> dict[str, set[str]]:
    paths = {module_name(path): path for path in modules(folder)}
    return {name: module_imports(path, set(paths)) - {name} for name, path in paths.items()}


def test_the_kv_core_uses_no_underscore_name_of_another_module_or_object():
    found = [v for path in modules("kv/core") for v in violations(path, strict=True)]
    assert found == []


# the one file that may reach into a third party's private names, and whose
THIRD_PARTY_INTERNALS = {"radixgate/cluster/ray_internals.py": "ray"}


def _allowed(violation: str) -> bool:
    where, what = violation.split(": ", 1)
    party = THIRD_PARTY_INTERNALS.get(where)
    return party is not None and what.replace("imports ", "").split()[0].split(".")[0] == party


@pytest.mark.parametrize("folder", [f for f in FOLDERS if f != "kv/core"])
def test_no_module_imports_or_reaches_into_another_modules_underscore_names(folder):
    found = {v for path in modules(folder) for v in violations(path, strict=False)}
    assert sorted(v for v in found if not _allowed(v)) == []


def test_only_the_named_file_reaches_into_ray_and_only_into_ray():
    found = violations(ROOT / "radixgate/cluster/ray_internals.py", strict=False)
    assert found and all(_allowed(v) for v in found)
    assert not _allowed("radixgate/cluster/ray_internals.py: imports _x from torch._C")
    assert not _allowed("radixgate/cluster/local_ray.py: imports ray._private.ray_constants")


def test_the_kv_core_modules_import_no_cycle():
    graph = import_graph("kv/core")
    assert len(graph) > 10                  # the walk found the package's modules
    assert import_cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_checks_see_private_imports_and_reaches(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / PACKAGE / "radix_cache").mkdir(parents=True)
    bad = tmp_path / PACKAGE / "radix_cache" / "bad.py"
    bad.write_text("from .tree import _split\nimport radixgate.kv.core.pool as pool\n"
                   "pool._free\ndef f(node):\n    return node._count\n")
    found = violations(bad, strict=True)
    assert len(found) == 3 and "_split" in found[0] and "pool._free" in found[1]
    assert violations(bad, strict=False) == found[:2]


def top_level_packages(root: Path) -> set[str]:
    return {p.parent.name for p in root.glob("*/__init__.py")}


def test_the_top_level_holds_no_package_that_could_shadow_an_installed_one():
    """pytest and ``python -m benchmarks.X`` put the repository root first on sys.path, so a
    top-level package folder wins over any installed package of its name: a bare ``kernels/``
    made transformers import it for the hub ``kernels`` package. The subpackages live under
    radixgate/; the top level has only radixgate, benchmarks and tests."""
    assert top_level_packages(ROOT) == {PACKAGE, "benchmarks", "tests"}
    for name in ("kernels", "runtime", "gateway", "cluster", "kv"):
        spec = importlib.util.find_spec(name)
        places = [*(spec.submodule_search_locations or []), spec.origin] if spec else []
        assert [p for p in places if p and ROOT / name in (Path(p), Path(p).parent)] == []
