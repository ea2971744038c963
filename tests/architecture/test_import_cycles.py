"""No import cycles among the modules of ringtorch, in any of its packages.

A cycle means two modules cannot be understood, tested or replaced one without the other, and
that which of them finishes importing first depends on who imported whom. The graph is built
from the ast of every module of the package (test_layers.import_records): an edge A -> B for
each import in A of module B, or of a name from B (``from pkg import mod`` names the module
pkg.mod when it is one). Which imports count:

* module-level imports: always;
* imports inside functions: counted too. A deferred import is the usual way to hide a cycle
  (it only moves the moment the two modules need each other), not to remove it;
* imports under ``if TYPE_CHECKING:``: not counted. They never run, and they name a type
  for the checker; the cure for such a dependency is a small protocol, which this test does
  not ask for.

Importing ``pkg.mod`` also runs ``pkg/__init__.py``; that implicit edge is not counted (a
package's ``__init__`` re-exporting its modules would otherwise always close a cycle).
"""

from __future__ import annotations

import pytest
from test_layers import PACKAGE, _module_name, import_records


def packages() -> list[str]:
    """Every package of ringtorch (a folder with an ``__init__.py``), ringtorch itself first:
    its graph holds every module, so a cycle across two packages is found there."""
    return sorted(_module_name(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py"))


# Cycles there today, through imports inside functions, each with its reason (delete the mark
# when the cycle is gone: the marks are strict).
KNOWN_CYCLES: dict[str, str] = {}


def _marked(names: list[str]) -> list[object]:
    return [pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_CYCLES[name]))
            if name in KNOWN_CYCLES else name for name in names]


def import_graph(package: str, *, deferred: bool) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports (``deferred``: imports inside
    functions count)."""
    modules = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph = {m: set() for m in modules if m == package or m.startswith(package + ".")}
    for module in graph:
        for record in import_records(modules[module]):
            if record.type_only or (record.in_function and not deferred):
                continue
            named = f"{record.module}.{record.name}" if record.name else record.module
            target = named if named in modules else record.module
            if target in graph and target != module:
                graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(graph: dict[str, set[str]], found: list[list[str]]) -> str:
    lines = []
    for component in found:
        lines.append("cycle among " + ", ".join(component) + ":")
        lines += [f"  {m} imports {', '.join(sorted(graph[m] & set(component)))}"
                  for m in component]
    return "\n".join(lines)


@pytest.mark.parametrize("package", packages())
def test_no_cycle_among_module_level_imports(package: str) -> None:
    graph = import_graph(package, deferred=False)
    found = cycles(graph)
    assert not found, _describe(graph, found)


@pytest.mark.parametrize("package", _marked(packages()))
def test_no_cycle_counting_imports_inside_functions(package: str) -> None:
    graph = import_graph(package, deferred=True)
    found = cycles(graph)
    assert not found, _describe(graph, found)


def test_the_cycle_finder_finds_cycles_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": {"g"}, "g": {"f"}}
    assert cycles(graph) == [["a", "b", "c"], ["f", "g"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_package_paths_exist() -> None:
    """The packages this file guards are where it looks (a renamed folder would make the
    cycle tests pass on an empty graph)."""
    found = packages()
    assert found[0] == "ringtorch" and len(import_graph("ringtorch", deferred=True)) > 100
    for package in ("ringtorch.collectives", "ringtorch.distributed.rpc", "ringtorch.launcher",
                    "ringtorch.store", "ringtorch._wire", "ringtorch.distributed"):
        assert package in found and len(import_graph(package, deferred=True)) > 3, package
    assert set(KNOWN_CYCLES) <= set(found)
