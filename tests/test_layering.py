"""The layers of DESIGN.md hold in the code: imports point down, and no package has a circle
of imports between its modules.

    simrun_cli      -> simrun_core        (and simrun_api only where `simrun serve` starts it)
    simrun_api      -> simrun_core
    simrun_harness  -> simrun_core
    simrun_core     -> nothing of ours

The import graph is read from the sources with `ast`, so nothing is imported to check it.
What counts as an import:
- for the direction of the layers, every import: at a module's top, inside a function (a lazy
  import is a dependency all the same) and under `if TYPE_CHECKING:` (the names are still used);
- for circles, every import that runs: at the top and inside functions, since a circle through
  a lazy import is still two modules that each need the other; those under
  `if TYPE_CHECKING:` are left out (they never run: the usual way to annotate with a type of a
  module that imports yours).
Relative imports are resolved; `from package import name` is an edge to the module `name`
where it is one, else to the package.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simrun_core", "simrun_harness", "simrun_api", "simrun_cli")
MAY_IMPORT = {
    "simrun_core": frozenset(),
    "simrun_harness": frozenset({"simrun_core"}),
    "simrun_api": frozenset({"simrun_core"}),
    "simrun_cli": frozenset({"simrun_core"}),
}
"""The packages of ours each package may import (besides its own modules)."""
SERVE_ENTRY = ("simrun_cli.main", frozenset({"serve", "_serve_local"}))
"""The one way the CLI reaches the service's code: `simrun serve` (and `simrun serve --local`)
start the service in the CLI's process, importing `simrun_api` inside these functions of
`simrun_cli.main`; everything else of the CLI talks to the service over HTTP."""


@dataclasses.dataclass(frozen=True)
class Import:
    """An import of a module of ours by another: where, and whether it runs."""

    importer: str
    imported: str
    line: int
    function: str | None
    """The function it is in (the outermost), None at the module's top."""
    typing_only: bool


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """The modules of the packages under `root`, by dotted name (a package by its own)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> Iterator[Import]:
    """The imports of modules of ours in a module's source."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        base = node.module or ""
        if node.level:
            anchor = package
            for _ in range(node.level - 1):
                anchor = anchor.rpartition(".")[0]
            base = f"{anchor}.{base}" if base else anchor
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def walk(node: ast.AST, function: str | None, typing_only: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in targets(child):
                    imported = known(name) if name.split(".")[0] in PACKAGES else None
                    if imported is not None and imported != module:
                        yield Import(module, imported, child.lineno, function, typing_only)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for statement in child.body:
                    yield from walk(ast.Module(body=[statement], type_ignores=[]), function, True)
                for statement in child.orelse:
                    yield from walk(
                        ast.Module(body=[statement], type_ignores=[]), function, typing_only
                    )
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(child, function or child.name, typing_only)
            else:
                yield from walk(child, function, typing_only)

    yield from walk(ast.parse(path.read_text(), str(path)), None, False)


def import_graph(root: Path, packages: tuple[str, ...]) -> list[Import]:
    modules = module_files(root, packages)
    return [
        found for module, path in modules.items() for found in imports_of(module, path, modules)
    ]


def upward_imports(imports: list[Import]) -> list[str]:
    """The imports of a package it may not import, as `importer:line -> imported`."""
    wrong = []
    for found in imports:
        importer, imported = found.importer.split(".")[0], found.imported.split(".")[0]
        if importer == imported or imported in MAY_IMPORT.get(importer, frozenset()):
            continue
        module, functions = SERVE_ENTRY
        if found.importer == module and found.function in functions and imported == "simrun_api":
            continue
        where = f" (in {found.function})" if found.function else ""
        wrong.append(f"{found.importer}:{found.line}{where} -> {found.imported}")
    return wrong


def circles(imports: list[Import]) -> list[list[str]]:
    """The circles of imports that run between the modules of one package (strongly connected
    sets of more than one module, Tarjan's algorithm), each sorted."""
    graph: dict[str, set[str]] = {}
    for found in imports:
        same_package = found.importer.split(".")[0] == found.imported.split(".")[0]
        if same_package and not found.typing_only:
            graph.setdefault(found.importer, set()).add(found.imported)
            graph.setdefault(found.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found_circles: list[list[str]] = []

    def connect(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph[module]):
            if other not in index:
                connect(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == module:
                    break
            if len(members) > 1:
                found_circles.append(sorted(members))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return sorted(found_circles)


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return import_graph(ROOT, PACKAGES)


def test_imports_point_down(imports: list[Import]) -> None:
    assert upward_imports(imports) == []


def test_the_cli_reaches_the_service_only_where_simrun_serve_starts_it(
    imports: list[Import],
) -> None:
    """The one exception is used, and only by the functions that start the service."""
    reaching = {(i.importer, i.function) for i in imports if i.imported.startswith("simrun_api")}
    reaching = {(m, f) for m, f in reaching if m.startswith("simrun_cli")}
    module, functions = SERVE_ENTRY
    assert reaching == {(module, function) for function in functions}


def test_no_package_has_an_import_circle(imports: list[Import]) -> None:
    assert circles(imports) == []


def test_the_graph_has_the_edges_of_the_layers(imports: list[Import]) -> None:
    edges = {(i.importer, i.imported) for i in imports}
    assert ("simrun_api.actor", "simrun_core.decider") in edges
    assert ("simrun_harness.report", "simrun_core.events") in edges


def test_the_checks_see_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    """A made-up tree with what the checks refuse: core importing the service at a function's
    top, a circle through a lazy import, and a typing-only import that makes no circle."""
    core = tmp_path / "simrun_core"
    core.mkdir()
    (core / "__init__.py").write_text("")
    (core / "a.py").write_text("from simrun_core import b\n")
    (core / "b.py").write_text("def f():\n    from . import a\n")
    (core / "c.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from simrun_core.a import x\n"
        "if TYPE_CHECKING:\n    from simrun_core.d import y\n"
    )
    (core / "d.py").write_text("import simrun_core.c\n\ndef g():\n    import simrun_api.app\n")
    found = import_graph(tmp_path, ("simrun_core",))
    assert upward_imports(found) == []  # simrun_api is not in the made-up tree
    modules = {**module_files(tmp_path, ("simrun_core",)), "simrun_api.app": tmp_path}
    with_api = [i for m, p in modules.items() if p.suffix for i in imports_of(m, p, modules)]
    assert upward_imports(with_api) == ["simrun_core.d:4 (in g) -> simrun_api.app"]
    assert circles(found) == [["simrun_core.a", "simrun_core.b"]]
