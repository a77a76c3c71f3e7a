"""``Engine`` (the thread and its command queue) calls only ``EngineCore`` methods: it never
reads the core's parts (tree, pool, manager, tier, counters...) nor writes the core's
attributes. The test walks engine.py's AST: every ``self.core.<name>`` (or a local alias of
``self.core``) must name a method of ``EngineCore``, called or handed to the command queue,
and never lead on to a further attribute."""
from __future__ import annotations

import ast
from pathlib import Path

ENGINE_DIR = Path(__file__).resolve().parents[1] / "radixgate" / "runtime" / "engine"

# name -> why Engine may reach it although it is not a method (each use of it passes)
ALLOWED: dict[str, str] = {}


def core_methods(core_source: str) -> set[str]:
    """The methods EngineCore defines (properties excluded)."""
    for node in ast.walk(ast.parse(core_source)):
        if isinstance(node, ast.ClassDef) and node.name == "EngineCore":
            return {item.name for item in node.body
                    if isinstance(item, ast.FunctionDef)
                    and not any(_decorator_name(d) == "property" for d in item.decorator_list)}
    raise AssertionError("core.py defines no EngineCore")


def _decorator_name(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def _is_self_core(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "core"
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def _aliases(function: ast.AST) -> set[str]:
    """Local names bound to ``self.core`` in ``function`` (``core = self.core``)."""
    return {target.id for node in ast.walk(function) if isinstance(node, ast.Assign)
            and _is_self_core(node.value)
            for target in node.targets if isinstance(target, ast.Name)}


def core_reaches(engine_source: str, methods: set[str],
                 allowed: dict[str, str] = ALLOWED) -> list[str]:
    """Each use of the core by Engine that is not a method of it (nor ``allowed``):
    'line N: self.core.x...'."""
    found = []
    module = ast.parse(engine_source)
    for cls in (n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "Engine"):
        for function in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            aliases = _aliases(function)
            parents = {child: node for node in ast.walk(function)
                       for child in ast.iter_child_nodes(node)}
            for node in ast.walk(function):
                if not isinstance(node, ast.Attribute):
                    continue
                owner = node.value
                if not (_is_self_core(owner) or (isinstance(owner, ast.Name)
                                                 and owner.id in aliases)):
                    continue
                if node.attr in allowed:
                    continue
                chained = isinstance(parents.get(node), ast.Attribute)
                written = not isinstance(node.ctx, ast.Load)
                if chained or written or node.attr not in methods:
                    found.append(f"line {node.lineno}: {ast.unparse(parents.get(node, node))}")
    return found


def test_engine_calls_only_core_methods():
    methods = core_methods((ENGINE_DIR / "core.py").read_text())
    assert core_reaches((ENGINE_DIR / "engine.py").read_text(), methods) == []


def test_the_allowed_names_are_still_needed():
    """An allowance nobody uses any more goes."""
    source = (ENGINE_DIR / "engine.py").read_text()
    for name in ALLOWED:
        assert f"core.{name}" in source, f"{name} is allowed but unused: drop it"


BAD_ENGINE = '''
class Engine:
    def __init__(self, loaded, config):
        self.core = EngineCore(loaded, config)
        self.block_size = self.core.pool.block_size          # a part's attribute
        self.limit = self.core.max_model_len                 # a plain attribute
        self.core.tier.wake = self._wake                     # wiring into a part

    def evict(self, n):
        return self._command(self.core.tree.evict, n)        # a part's method

    def abort(self, rid):
        return self._command(self.core.abort, rid)           # fine: a core method

    def _begin_drain(self):
        self.core.draining = True                            # a write

    def _run(self):
        core = self.core
        core.counters.stalls += 1                            # through an alias
        core.step()                                          # fine
'''


def test_the_walk_finds_each_kind_of_reach():
    reaches = core_reaches(BAD_ENGINE, {"abort", "step"}, allowed={})
    lines = sorted(int(r.split(":")[0].split()[1]) for r in reaches)
    assert lines == [5, 6, 7, 10, 16, 20], reaches
