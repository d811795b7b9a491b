"""No import circles in ``effectgate``: the graph of its modules' imports, read from the
source (nothing is imported), has no strongly connected component of more than one module.

What counts as an edge: every ``import`` / ``from ... import`` of an ``effectgate`` module
anywhere in a module's source — at the top, inside a function (a deferred import is still a
dependency: it only hides the circle until the first call), and under ``if TYPE_CHECKING:``
(a type-only back-reference is still a circle a reader must hold in their head, and the one
mypy follows). ``from . import x`` is an edge to the submodule ``x`` when it is one, else to
the package.

What does not count: an import of a module's own enclosing package (``from . import Store``
in ``effectgate.store.async_pg``, ``from .. import __version__``). Python runs a package's
``__init__`` before any of its submodules, whoever imports them, so that edge is there in
every program and no layout of the submodule removes it; a package that re-exports its
submodules would otherwise form a "circle" with each one. An import of a *sibling* or of
anything outside the enclosing packages always counts. The graph covers ``core/`` (the
package ``effectgate``) and ``integrations/`` (``effectgate.integrations``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__: list[str] = []

ROOT = Path(__file__).resolve().parent.parent
TREES = {"effectgate": ROOT / "core", "effectgate.integrations": ROOT / "integrations"}


def _modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (a package is its ``__init__``)."""
    found: dict[str, Path] = {}
    for package, folder in TREES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The ``effectgate`` modules ``name`` (at ``path``) imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _resolve(alias.name, modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    yield sub
                else:
                    yield from _resolve(target, modules)


def _resolve(dotted: str, modules: dict[str, Path]) -> Iterator[str]:
    """The longest known module that ``dotted`` names (``a.b.C`` -> ``a.b``), if any."""
    parts = dotted.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            yield candidate
            return
        parts.pop()


def import_graph() -> dict[str, set[str]]:
    """Each module of ``effectgate`` and the ``effectgate`` modules it imports."""
    modules = _modules()
    return {name: {t for t in _imports(name, path, modules)
                   if t != name and not _encloses(t, name)}
            for name, path in modules.items()}


def _encloses(package: str, name: str) -> bool:
    """Whether ``package`` is one of the packages ``name`` sits in."""
    return name.startswith(package + ".")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def test_the_package_has_no_import_circles() -> None:
    """Every strongly connected component of the import graph is a single module."""
    found = circles(import_graph())
    assert found == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_graph_is_read_from_the_source() -> None:
    """The graph really holds the package's edges (a deferred and a type-only import too), so
    an empty list of circles is not an empty graph."""
    graph = import_graph()
    assert len(graph) > 80
    assert "effectgate.store" in graph["effectgate.gate"]
    assert "effectgate.errors" in graph["effectgate.decide"]
    assert sum(len(targets) for targets in graph.values()) > 300


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}, [["a", "b", "c"]]),
])
def test_circles_finds_strongly_connected_components(
        graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    """The detector itself: a two- and a three-module circle are found, a chain is not."""
    assert circles(graph) == expected
