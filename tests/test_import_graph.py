"""The import graph, as an import-graph tool (grimp) sees the package: every subpackage is
visible through radixgate/ (a symlink per top-level folder), dependencies point downwards
only (ARCHITECTURE.md section 1: gateway -> cluster -> runtime -> kernels, radix_cache) and no modules import each other in a cycle."""
from __future__ import annotations

import grimp
import pytest

from tests.support.graphs import import_cycles

LAYERS = ("radixgate.gateway", "radixgate.cluster", "radixgate.runtime", "radixgate.kernels",
          "radixgate.radix_cache")


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("radixgate", exclude_type_checking_imports=True)


def test_the_tool_sees_every_subpackage_and_their_imports(graph):
    for package in LAYERS:
        assert len(graph.find_children(package)) >= 5, package
    imported = graph.find_modules_directly_imported_by("radixgate.gateway.service")
    assert "radixgate.runtime.api" in imported


@pytest.mark.parametrize("lower, upper", [(LAYERS[j], LAYERS[i]) for i in range(len(LAYERS))
                                          for j in range(i + 1, len(LAYERS))])
def test_dependencies_point_downwards(graph, lower, upper):
    chain = graph.find_shortest_chain(importer=lower, imported=upper, as_packages=True)
    assert chain is None, f"{lower} reaches {upper} through {chain}"


def test_gateway_never_imports_the_kernels_itself(graph):
    """The gateway never touches a tensor: it reaches kernels only through the runtime."""
    direct = [(m, i) for m in graph.find_descendants("radixgate.gateway")
              for i in graph.find_modules_directly_imported_by(m)
              if i == "radixgate.kernels" or i.startswith("radixgate.kernels.")]
    assert direct == []


def test_no_import_cycles(graph):
    cycles = import_cycles({m: graph.find_modules_directly_imported_by(m) for m in graph.modules})
    assert cycles == [], cycles


def test_the_cycle_finder_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
