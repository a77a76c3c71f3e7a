"""Checks a Markdown document's Python signatures against the code they describe.

A document (docs/INTERFACES.md) holds fenced ```python blocks; the nearest heading above a
block names its module in backticks (``### `radixgate.kv.core.pool` ``). Each block is
Python with bodies elided (``...``) and prose in comments. ``check_block(module, source)``
lists every place where the block and the module disagree:

- ``class C(Base)``: ``C`` exists, with those base classes and decorators
  (``@dataclass(frozen=True)`` must match the real dataclass's parameters);
- a dataclass's annotated fields are the real fields, in order, with the same annotations
  and defaults (all of them: a dataclass block is its whole field list);
- a ``typing.Protocol``'s methods are all of the protocol's methods;
- any other class lists some of its methods and attributes (``name: type``, set somewhere
  in the class's source);
- ``def f(...) -> R``: parameters, defaults, annotations, return annotation and decorators
  equal the definition's (compared as normalised source text, so ``Sequence[int]`` and
  ``typing.Sequence[int]`` differ: the document writes what the code writes);
- ``NAME = literal``: the module's constant has that value.

Anything else at a block's top level is a problem too, so a block cannot say something
this check does not read.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
from dataclasses import dataclass

HEADING = re.compile(r"^#{1,6} (.*)$", re.MULTILINE)
MODULE = re.compile(r"`(radixgate(?:\.\w+)+)`")
FENCE = re.compile(r"^[ \t]*```python\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class DocBlock:
    module: str
    source: str
    line: int


def python_blocks(text: str) -> list[DocBlock]:
    """Every fenced python block of ``text`` with the module its nearest heading names."""
    fences = list(FENCE.finditer(text))
    headings = [(m.start(), MODULE.search(m.group(1))) for m in HEADING.finditer(text)
                if not any(f.start() < m.start() < f.end() for f in fences)]   # not a comment
    blocks = []
    for fence in fences:
        above = [name for pos, name in headings if pos < fence.start()]
        module = above[-1].group(1) if above and above[-1] else ""
        line = text.count("\n", 0, fence.start()) + 1
        blocks.append(DocBlock(module, textwrap.dedent(fence.group(1)), line))
    return blocks


def check_block(module_name: str, source: str) -> list[str]:
    """The disagreements between a block and ``module_name`` (empty: they agree)."""
    if not module_name:
        return ["block has no heading naming its module (### `radixgate.x`)"]
    module = importlib.import_module(module_name)
    problems = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            problems += _check_class(module, node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            problems += _check_function(module, node.name, getattr(module, node.name, None), node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            problems += _check_constant(module, node)
        else:
            problems.append(f"line {node.lineno}: unchecked statement {ast.unparse(node)[:60]!r}")
    return problems


def _check_constant(module, node: ast.Assign) -> list[str]:
    name = ast.unparse(node.targets[0])
    if not hasattr(module, name):
        return [f"{module.__name__}.{name}: missing"]
    want = ast.literal_eval(node.value)
    got = getattr(module, name)
    return [] if got == want else [f"{name}: documented {want!r}, is {got!r}"]


def _source_def(obj) -> ast.FunctionDef | ast.ClassDef | None:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(obj))))
    except (OSError, TypeError):
        return None
    return tree.body[0] if tree.body else None


def _decorators(node) -> list[str]:
    return [ast.unparse(d) for d in node.decorator_list]


def _check_function(owner, name: str, real, doc: ast.FunctionDef) -> list[str]:
    where = f"{getattr(owner, '__name__', owner)}.{name}"
    if real is None:
        return [f"{where}: missing"]
    if isinstance(real, (staticmethod, classmethod)):
        real = real.__func__
    if isinstance(real, property):
        real = real.fget
    code = _source_def(real)
    if not isinstance(code, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [f"{where}: not a def in the source"]
    problems = []
    for what, doc_text, code_text in (
            ("parameters", ast.unparse(doc.args), ast.unparse(code.args)),
            ("return", _unparse(doc.returns), _unparse(code.returns)),
            ("decorators", _decorators(doc), _decorators(code)),
            ("async", isinstance(doc, ast.AsyncFunctionDef), isinstance(code, ast.AsyncFunctionDef))):
        if doc_text != code_text:
            problems.append(f"{where}: {what} documented {doc_text!r}, code has {code_text!r}")
    return problems


def _unparse(node) -> str:
    return "" if node is None else ast.unparse(node)


def _check_class(module, doc: ast.ClassDef) -> list[str]:
    where = f"{module.__name__}.{doc.name}"
    real = getattr(module, doc.name, None)
    if not inspect.isclass(real):
        return [f"{where}: missing (or not a class)"]
    code = _source_def(real)
    if not isinstance(code, ast.ClassDef):
        return [f"{where}: no class source"]
    problems = []
    for what, doc_text, code_text in (
            ("bases", [ast.unparse(b) for b in doc.bases], [ast.unparse(b) for b in code.bases]),
            ("decorators", _decorators(doc), _decorators(code))):
        if doc_text != code_text:
            problems.append(f"{where}: {what} documented {doc_text}, code has {code_text}")
    if dataclasses.is_dataclass(real):
        problems += _check_fields(where, doc, code)
    else:
        problems += _check_attributes(where, doc, code)
    documented = set()
    for item in doc.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            documented.add(item.name)
            real_attr = inspect.getattr_static(real, item.name, None)
            problems += _check_function(real, item.name, real_attr, item)
        elif not isinstance(item, (ast.AnnAssign, ast.Expr, ast.Pass)):
            problems.append(f"{where}: unchecked statement {ast.unparse(item)[:60]!r}")
    if "Protocol" in [ast.unparse(b) for b in code.bases]:
        methods = {i.name for i in code.body if isinstance(i, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if methods - documented:
            problems.append(f"{where}: protocol methods not documented: {sorted(methods - documented)}")
    return problems


def _fields(node: ast.ClassDef) -> list[tuple[str, str, str]]:
    return [(ast.unparse(i.target), ast.unparse(i.annotation), _unparse(i.value))
            for i in node.body if isinstance(i, ast.AnnAssign)]


def _check_fields(where: str, doc: ast.ClassDef, code: ast.ClassDef) -> list[str]:
    doc_fields, code_fields = _fields(doc), _fields(code)
    if doc_fields == code_fields:
        return []
    wrong = [f"{n}: {a}{' = ' + v if v else ''}" for n, a, v in doc_fields if (n, a, v) not in code_fields]
    left = [n for n, a, v in code_fields if n not in {d[0] for d in doc_fields}]
    return [f"{where}: fields differ (documented wrongly: {wrong}; undocumented: {left}; "
            f"or out of order)"]


def _check_attributes(where: str, doc: ast.ClassDef, code: ast.ClassDef) -> list[str]:
    known = {ast.unparse(i.target) for i in code.body if isinstance(i, ast.AnnAssign)}
    for node in ast.walk(code):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        known |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                  and isinstance(t.value, ast.Name) and t.value.id == "self"}
    known |= {i.name for i in code.body if isinstance(i, ast.FunctionDef)}   # properties
    return [f"{where}.{name}: attribute not set in the class"
            for name, _, _ in _fields(doc) if name not in known]
