"""No switch on a group's kind name outside ``wsym/group/kinds/``.

What a kind does is its kind object's (``kind_of(g).permutes``, ``.flips``,
``.diagonal``, ``isinstance``/``type`` checks on the kind classes): a comparison of
``g.kind`` with a kind's name (``g.kind == "gl"``, ``g.kind in ("scaling", "sign")``)
spreads that knowledge, and goes stale when a kind is added. Names stay where they
are names: serialization (``wsym/group/spec.py``) and a user's ``kinds=`` argument
(compared with a variable, not a literal).
"""

import ast
from pathlib import Path

import wsym
from wsym.group.kinds import KIND_CLASSES

PACKAGE = Path(wsym.__file__).parent
# where kind names are names: the kinds themselves, and (de)serialization
ALLOWED = ("group/kinds/", "group/spec.py")


def _names(node) -> set[str]:
    """String literals of ``node`` (a constant, or a tuple/list/set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names(e) for e in node.elts)) if node.elts else set()
    return set()


def switches(source: str, kinds: set[str]) -> list[int]:
    """Lines comparing an attribute ``.kind`` with a kind's name."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides):
            if any(_names(s) & kinds for s in sides):
                out.append(node.lineno)
    return out


def test_no_kind_name_switch_outside_the_kinds():
    kinds = set(KIND_CLASSES)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(ALLOWED):
            continue
        found += [f"{rel}:{line}" for line in switches(path.read_text(), kinds)]
    assert not found, f"switch on kind_of(g)'s flags instead: {found}"


def test_a_switch_is_found():
    kinds = {"gl", "sign"}
    assert switches('if g.kind == "gl":\n    pass\n', kinds) == [1]
    assert switches('x = [g for g in gs if g.kind in ("sign", "x")]\n', kinds) == [1]
    assert switches("if g.kind == kind:\n    pass\n", kinds) == []
    assert switches('if p.kind == "edge":\n    pass\n', kinds) == []
