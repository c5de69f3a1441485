"""No import circles in wsym/, counting the imports inside functions.

An import inside a function hides a circle from Python's import system but not from
the reader: two modules that need each other are one concept split in two, or share
a piece that belongs one floor down. ``CIRCLES`` lists the circles that remain (none); the
test fails on a new one and on one that no longer exists (delete it from the list).
"""

import ast
from pathlib import Path

import networkx as nx

import wsym

PACKAGE = Path(wsym.__file__).parent

#: Strongly connected components of the import graph still to be broken.
CIRCLES: set[frozenset[str]] = set()


def modules() -> dict[str, Path]:
    """``{dotted name: path}`` of every module of the package (packages by their name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, known: dict) -> set[str]:
    """The wsym modules ``name`` imports anywhere in its body (functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets |= {
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            }
        elif isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
    resolved = set()
    for target in targets:
        while target and target not in known:  # an attribute of a module: the module
            target = target.rpartition(".")[0]
        if target.startswith("wsym") and target != name:
            resolved.add(target)
    return resolved


def circles() -> set[frozenset[str]]:
    known = modules()
    graph = nx.DiGraph()
    for name, path in known.items():
        graph.add_edges_from((name, target) for target in imported(name, path, known))
    return {frozenset(c) for c in nx.strongly_connected_components(graph) if len(c) > 1}


def test_the_import_graph_has_no_new_circle():
    found = circles()
    new = [sorted(c) for c in found - CIRCLES]
    gone = [sorted(c) for c in CIRCLES - found]
    assert not new, f"new import circles (move the shared piece one floor down): {new}"
    assert not gone, f"circles broken, delete them from CIRCLES: {gone}"


def test_an_import_inside_a_function_counts(tmp_path):
    pkg = tmp_path / "wsym"
    pkg.mkdir()
    (pkg / "a.py").write_text("def f():\n    from wsym.b import g\n")
    (pkg / "b.py").write_text("from wsym import a\n")
    known = {"wsym.a": pkg / "a.py", "wsym.b": pkg / "b.py", "wsym": pkg / "__init__.py"}
    assert imported("wsym.a", known["wsym.a"], known) == {"wsym.b"}
    assert imported("wsym.b", known["wsym.b"], known) == {"wsym.a"}
