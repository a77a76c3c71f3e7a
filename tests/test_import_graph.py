"""The import graph, as an import-graph tool (grimp) sees the package: every subpackage is
visible under radixgate/, dependencies point downwards
only (ARCHITECTURE.md section 1: gateway -> cluster -> runtime -> kernels, kv; inside the KV
package, the manager -> the tiers, groups and events -> the torch-free core) and no modules
import each other in a cycle."""
from __future__ import annotations

import grimp
import pytest

from tests.support.graphs import import_cycles

LAYERS = ("radixgate.gateway", "radixgate.cluster", "radixgate.runtime", "radixgate.kernels",
          "radixgate.kv")
# The KV package's rooms, highest first: the manager sees everything below it; the tiers,
# the attention groups and the events know nothing of the manager; the core (tree, pool,
# policies) knows none of them.
KV_LAYERS = ("radixgate.kv.manager", "radixgate.kv.tiers", "radixgate.kv.core")
KV_SIDE_PACKAGES = ("radixgate.kv.groups", "radixgate.kv.events")
# The runtime's model side knows nothing of requests (the engine side).
RUNTIME_LAYERS = ("radixgate.runtime.engine", "radixgate.runtime.model")


def downward_pairs(layers):
    """``(lower, upper)`` for every pair of ``layers`` (listed highest first)."""
    return [(layers[j], layers[i]) for i in range(len(layers)) for j in range(i + 1, len(layers))]


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("radixgate", exclude_type_checking_imports=True)


def test_the_tool_sees_every_subpackage_and_their_imports(graph):
    for package in LAYERS + RUNTIME_LAYERS + ("radixgate.kv.core", "radixgate.kv.tiers"):
        assert len(graph.find_descendants(package)) >= 5, package
    imported = graph.find_modules_directly_imported_by("radixgate.gateway.service")
    assert "radixgate.runtime.engine.api" in imported


@pytest.mark.parametrize("lower, upper", downward_pairs(LAYERS))
def test_dependencies_point_downwards(graph, lower, upper):
    chain = graph.find_shortest_chain(importer=lower, imported=upper, as_packages=True)
    assert chain is None, f"{lower} reaches {upper} through {chain}"


@pytest.mark.parametrize("lower, upper", downward_pairs(RUNTIME_LAYERS))
def test_the_model_side_imports_nothing_of_the_engine_side(graph, lower, upper):
    """runtime.model reaches no module of runtime.engine, not even through another."""
    chain = graph.find_shortest_chain(importer=lower, imported=upper, as_packages=True)
    assert chain is None, f"{lower} reaches {upper} through {chain}"


@pytest.mark.parametrize("lower, upper", downward_pairs(KV_LAYERS) + [
    (side, "radixgate.kv.manager") for side in KV_SIDE_PACKAGES] + [
    ("radixgate.kv.core", side) for side in KV_SIDE_PACKAGES])
def test_inside_the_kv_package_dependencies_point_downwards(graph, lower, upper):
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
