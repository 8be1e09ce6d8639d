"""The package's structure: no import circle among its modules, and a short spine."""

from __future__ import annotations

import ast
import pathlib

import networkx as nx
import pytest

ROOT = pathlib.Path(__file__).parent.parent
PACKAGES = {"autoremat": ROOT / "autoremat", "autoremat_ilp": ROOT / "solvers" / "autoremat_ilp",
            "autoremat_solvers": ROOT / "solvers" / "autoremat_solvers"}


def _module_name(path: pathlib.Path) -> str:
    for folder in PACKAGES.values():
        if folder in path.parents or path.parent == folder:
            rel = path.relative_to(folder.parent).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            return ".".join(parts)
    raise ValueError(path)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for folder in PACKAGES.values() for p in folder.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, name: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``tree`` imports when it runs: at the top and inside
    functions, not under ``if TYPE_CHECKING:``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[:len(name.split(".")) - node.level + 1]
                if not name.endswith("__init__"):
                    package = name.split(".")[:-node.level] if node.level else []
                base = ".".join([*package, *([base] if base else [])])
            for a in node.names:  # a submodule, or a name defined in ``base``
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in known and m != name}


def import_graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in _imports(ast.parse(path.read_text()), name, set(modules)):
            graph.add_edge(name, target)
    return graph


def test_no_import_circle():
    graph = import_graph()
    # A package's __init__ re-exporting its modules is not a circle with them.
    packages = set(PACKAGES) | {n for n in graph if (_modules()[n].name == "__init__.py")}
    edges = [(a, b) for a, b in graph.edges if not (a in packages and b.startswith(a + "."))]
    cycles = list(nx.simple_cycles(nx.DiGraph(edges)))
    assert cycles == [], f"import circles: {cycles}"


def test_the_solvers_do_not_import_the_library():
    graph = import_graph()
    assert [(a, b) for a, b in graph.edges
            if a.startswith("autoremat_solvers") and b.split(".")[0] == "autoremat"] == []


def test_the_ilp_imports_neither_the_library_nor_the_research_solvers():
    graph = import_graph()
    assert [(a, b) for a, b in graph.edges if a.startswith("autoremat_ilp")
            and b.split(".")[0] in ("autoremat", "autoremat_solvers")] == []


def test_the_plan_record_does_not_import_the_planner():
    below = nx.descendants(import_graph(), "autoremat._plan")
    assert not {m for m in below if m.startswith("autoremat._planner")}


def _code_lines(path: pathlib.Path, function: str) -> int:
    """Lines of code of ``function`` in ``path``: its body without docstring or blanks."""
    tree = ast.parse(path.read_text())
    node = next(n for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef) and n.name == function)
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    lines = path.read_text().splitlines()[body[0].lineno - 1:node.end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


@pytest.mark.parametrize("path, function", [
    ("autoremat/_planner/_api.py", "plan"),
    ("autoremat/_planner/_api.py", "plan_with"),
    ("autoremat/_planner/_search.py", "search"),
    ("autoremat/_planner/_closed_loop.py", "run"),
    ("solvers/autoremat_ilp/model.py", "build_model"),
    ("autoremat/_trace/_graph_builder.py", "graph_of"),
])
def test_the_spine_is_short(path, function):
    assert _code_lines(ROOT / path, function) < 60
