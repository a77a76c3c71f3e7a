"""Wired by constructors: no module of radixgate/kv or radixgate/runtime hands a callback
to another object by assigning it to that object's attribute after construction (issue 48).
Every object gets what it calls as a constructor argument or a returned handle.

The test reads the source (AST) and imports nothing. It flags:

- ``x.attr = value`` where ``x`` is not ``self``/``cls`` (``other.attr``,
  ``self.part.attr``, ...) and ``value`` looks callable: a lambda, a ``partial(...)``, a
  function of the module (not shadowed by a local), ``self.m`` for a method ``m`` of the
  enclosing class (or one it may inherit: defined somewhere, never assigned as data), or
  ``obj.m`` for a name some function or method of radixgate is defined under (properties
  aside);
- the same through ``setattr(x, "attr", value)``;
- ``x.attr = None`` for an attribute that some class declares ``Callable`` (a hook cleared
  at teardown is the same wiring, undone).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("radixgate/kv", "radixgate/runtime")
OWN = frozenset({"self", "cls"})
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
ACCESSORS = frozenset({"property", "cached_property", "setter", "getter", "deleter"})


@dataclass(frozen=True)
class Names:
    """What an attribute name may stand for, from the whole package."""

    functions: frozenset[str]      # names functions and methods are defined under
    data: frozenset[str]           # names assigned as ``self.name = ...``
    hooks: frozenset[str]          # attributes declared ``Callable``

    @classmethod
    def of(cls, trees) -> Names:
        functions, data, hooks = set(), set(), set()
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, FUNCTIONS) and not _is_accessor(node):
                    functions.add(node.name)
                for target in _targets(node):
                    if _is_own(target):
                        data.add(target.attr)
                        if (isinstance(node, ast.AnnAssign)
                                and "Callable" in ast.unparse(node.annotation)):
                            hooks.add(target.attr)
        return cls(frozenset(functions), frozenset(data), frozenset(hooks))


def _is_accessor(fn: ast.AST) -> bool:
    return any((d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")) in ACCESSORS
               for d in fn.decorator_list)


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, ast.AnnAssign) and node.value is not None:
        return [node.target]
    return []


def _is_own(target: ast.AST) -> bool:
    return (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
            and target.value.id in OWN)


def _methods(node: ast.ClassDef) -> set[str]:
    return {n.name for n in node.body if isinstance(n, FUNCTIONS) and not _is_accessor(n)}


class PatchFinder(ast.NodeVisitor):
    """Collects ``"path:line: target = value"`` for each callback one module assigns to
    another object's attribute."""

    def __init__(self, path: str, module: ast.Module, names: Names):
        self.path, self.names = path, names
        self.methods: list[set[str]] = [set()]           # of the enclosing class
        self.functions = [{n.name for n in module.body if isinstance(n, FUNCTIONS)}]
        self.found: list[str] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.methods.append(_methods(node))
        self.generic_visit(node)
        self.methods.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        nested = {n.name for n in ast.walk(node) if isinstance(n, FUNCTIONS) and n is not node}
        bound = {n.id for n in ast.walk(node)
                 if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        bound |= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        self.functions.append((self.functions[-1] - bound) | nested)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check(node, target, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._check(node, node.target, node.value)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        args = node.args
        if (isinstance(node.func, ast.Name) and node.func.id == "setattr" and len(args) == 3
                and isinstance(args[1], ast.Constant) and isinstance(args[1].value, str)):
            self._check(node, ast.Attribute(args[0], args[1].value, ast.Store()), args[2])
        self.generic_visit(node)

    def _check(self, node: ast.AST, target: ast.AST, value: ast.AST) -> None:
        if not isinstance(target, ast.Attribute) or _is_own(target):
            return
        clears_hook = (isinstance(value, ast.Constant) and value.value is None
                       and target.attr in self.names.hooks)
        if clears_hook or self._callable(value):
            self.found.append(f"{self.path}:{node.lineno}: "
                              f"{ast.unparse(target)} = {ast.unparse(value)}")

    def _callable(self, value: ast.AST) -> bool:
        if isinstance(value, ast.Lambda):
            return True
        if isinstance(value, ast.IfExp):
            return self._callable(value.body) or self._callable(value.orelse)
        if isinstance(value, ast.Call):
            func = value.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            return name == "partial"
        if isinstance(value, ast.Name):
            return value.id in self.functions[-1]
        if isinstance(value, ast.Attribute):
            if isinstance(value.value, ast.Name) and value.value.id in OWN:
                return value.attr in self.methods[-1] or (value.attr in self.names.functions
                                                          and value.attr not in self.names.data)
            return value.attr in self.names.functions
        return False


def find_patches(sources: dict[str, str], package: dict[str, str] | None = None) -> list[str]:
    """Every callback assigned to another object's attribute in ``sources`` (path -> text),
    the names resolved against ``package`` (path -> text; default: ``sources``)."""
    trees = {path: ast.parse(text, path) for path, text in sources.items()}
    others = [ast.parse(text, path) for path, text in (package or {}).items()]
    names = Names.of(list(trees.values()) + others)
    found = []
    for path, tree in trees.items():
        finder = PatchFinder(path, tree, names)
        finder.visit(tree)
        found += finder.found
    return found


def _sources(*folders: str) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for folder in folders
            for p in sorted((ROOT / folder).rglob("*.py"))}


def test_no_callback_is_assigned_to_another_objects_attribute():
    assert find_patches(_sources(*SCANNED), _sources("radixgate")) == []


# Each assignment of a callback after construction in commit 7a2651a (before step 2 of
# issue 48), in its class or function as it was there: the finder must flag every one.
BEFORE = {
    "kv/manager.py": '''
class KVManager:
    def __init__(self, tree, pool):
        pool.on_free = self.window.on_main_free
        self.window.protected = self._pinned_window_blocks
        self.window.on_tombstone = self._announce_windowless

    def _pinned_window_blocks(self): ...
    def _announce_windowless(self, blocks): ...
''',
    "kv/tiers/disk/glue.py": '''
def open_tier(config, kv, tree, fingerprint, description):
    tree.spill = lambda node, start, end, blocks: spill_path(tier, node, end)

def spill_path(tier, node, end): ...
''',
    "runtime/engine/core.py": '''
class EngineCore:
    def __init__(self, loaded, config):
        self.tree.on_event = self.spec_store.on_event

    def close(self):
        self.tier = self.blocks.tier = self.tree.spill = None
''',
    "runtime/engine/engine.py": '''
class Engine:
    def __init__(self, loaded, config):
        self.core.tier.wake = self._wake

    def _kv_event_publisher(self):
        self.core.tree.on_event = publisher.put if drafts is None else \\
            (lambda event: (drafts(event), publisher.put(event)))

    def _wake(self): ...
''',
    "runtime/engine/handle.py": '''
class RequestHandle:
    def __init__(self, request_id, sink, abort):
        sink.on_overflow_loop = self._reader_fell_behind

    def _reader_fell_behind(self): ...
''',
    "kv/core/tree.py": '''
class RadixTree:
    def __init__(self):
        self.spill: Callable[[TreeNode, int, int, list[int]], None] | None = None
''',
    "elsewhere.py": '''
def wire(a, b, c):
    setattr(a, "on_done", b.finish)
    c.callback = partial(print, 1)
    c.then = finish

def finish(): ...
''',
}
DEFINED = {"other.py": "def on_main_free(): ...\ndef on_event(): ...\ndef put(): ...\n"}


def test_the_finder_flags_every_callback_assigned_before_step_2():
    found = find_patches(BEFORE, {**BEFORE, **DEFINED})
    assert [line.split(": ", 1)[1] for line in found] == [
        "pool.on_free = self.window.on_main_free",
        "self.window.protected = self._pinned_window_blocks",
        "self.window.on_tombstone = self._announce_windowless",
        "tree.spill = lambda node, start, end, blocks: spill_path(tier, node, end)",
        "self.tree.on_event = self.spec_store.on_event",
        "self.tree.spill = None",
        "self.core.tier.wake = self._wake",
        "self.core.tree.on_event = publisher.put if drafts is None else "
        "lambda event: (drafts(event), publisher.put(event))",
        "sink.on_overflow_loop = self._reader_fell_behind",
        "a.on_done = b.finish",                          # setattr(a, "on_done", b.finish)
        "c.callback = partial(print, 1)",
        "c.then = finish",
    ]


@pytest.mark.parametrize("line", [
    "self.on_done = on_done",                  # its own attribute, from its constructor
    "node.parent = self.parent",               # data of this class
    "state.last_access = self.tick",           # data (set by a base class), a method elsewhere
    "seq.status = SeqStatus.FINISHED",
    "self.tier = self.blocks.tier = None",     # tier is not declared Callable
    "other.count = count",                     # a local, not the module's function
    "other.size = len(items)",
])
def test_the_finder_leaves_data_alone(line):
    source = ("class A(Base):\n    def __init__(self):\n        self.parent = 1\n"
              f"    def m(self, on_done, count, node, state, seq, other, items):\n        {line}\n"
              "def count(): ...\n")
    base = ("class Base:\n    def __init__(self):\n        self.tick = 0\n"
            "class T:\n    def tick(self): ...\n")
    assert find_patches({"a.py": source}, {"a.py": source, "base.py": base}) == []
