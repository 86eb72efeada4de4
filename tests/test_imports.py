"""The project's module graph has no cycles, counting every import statement wherever it stands: at the top,
inside functions, under `if TYPE_CHECKING:`, in try/except.  A cycle makes the import order matter and hides a
layering mistake; the test reads source, not `sys.modules`, so imports that have not run count too.

Modules are the `.py` files under the repository root outside `tests/` (and outside hidden folders and virtual
environments).  An import names the longest dotted prefix that is one of those modules: `from simulator.run
import run_scenario` is an edge to `simulator.run`, `from costmodel.methods import HACK` one to the package
`costmodel.methods` (its `__init__.py`).  Imports of anything else (the standard library, numpy) are not edges.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def product_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `root` outside tests/, hidden folders, caches and
    virtual environments."""
    mods: dict[str, Path] = {}
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(
            d
            for d in dirs
            if not (
                d.startswith((".", "__pycache__"))
                or (here / d / "pyvenv.cfg").exists()
                or (here == root and d == "tests")
            )
        )
        for name in sorted(files):
            if name.endswith(".py"):
                parts = (here / name).relative_to(root).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                mods[".".join(parts)] = here / name
    return mods


def imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name an import statement anywhere in the file could load (absolute, relatives resolved)."""
    is_package = path.name == "__init__.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports (the longest prefix of each imported name that is one)."""
    mods = product_modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        deps = set()
        for name in imported_names(module, path):
            parts = name.split(".")
            for i in range(len(parts), 0, -1):
                if ".".join(parts[:i]) in mods:
                    deps.add(".".join(parts[:i]))
                    break
        deps.discard(module)
        graph[module] = deps
    return graph


def tangles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The graph's strongly connected components of more than one module: each is one or more import cycles."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph has ~100 nodes, recursion is fine
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return found


def test_the_project_import_graph_is_acyclic():
    graph = import_graph(ROOT)
    # The walk found the product, not an empty folder: every top-level package and its entities.
    for module in (
        "cli",
        "simulator.run",
        "simulator.decode",
        "costmodel.phases",
        "planning.executor",
        "reports.html",
        "kernels_calibration.profile",
        "realrun.runner",
        "catalog",
        "benchmarks.sim_speed",
    ):
        assert module in graph, module
    assert sum(map(len, graph.values())) > 200
    found = tangles(graph)
    assert not found, "import cycles among: " + "; ".join(" ".join(sorted(c)) for c in found)


def test_imports_inside_functions_and_under_type_checking_count(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.c import g\n    return g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("import pkg.a\n")
    graph = import_graph(tmp_path)
    assert graph == {"pkg": set(), "pkg.a": {"pkg", "pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}}
    assert tangles(graph) == {frozenset({"pkg.a", "pkg.b", "pkg.c"})}
    (pkg / "c.py").write_text("import numpy\nfrom pkg import b as _b  # noqa\n")
    (pkg / "d.py").write_text("import pkg.e\n")
    (pkg / "e.py").write_text("try:\n    from pkg.d import y\nexcept ImportError:\n    y = None\n")
    assert tangles(import_graph(tmp_path)) == {frozenset({"pkg.b", "pkg.c"}), frozenset({"pkg.d", "pkg.e"})}
    (pkg / "c.py").write_text("import numpy\n")
    (pkg / "e.py").write_text("import pkg\n")
    assert tangles(import_graph(tmp_path)) == set()


@pytest.mark.parametrize(
    "line, module, expected",
    [
        ("from ..x import y", "pkg.sub.m", {"pkg.x", "pkg.x.y"}),
        ("from . import y", "pkg.sub", {"pkg.sub", "pkg.sub.y"}),  # inside pkg/sub/__init__.py
        ("import a.b.c", "pkg.m", {"a.b.c"}),
    ],
)
def test_relative_imports_resolve(tmp_path, line, module, expected):
    path = tmp_path / ("__init__.py" if module == "pkg.sub" else "m.py")
    path.write_text(line + "\n")
    assert imported_names(module, path) == expected
