"""Why a group is absent: per parameter axis, the operation that blocked each kind.

The analysis remembers, per atom class, the reason it was blocked (an unknown
operation, a model input or output), the first operation that ruled out GL and
orthogonal maps, and the operations that fixed an exponent (``pins``); the
verification adds the candidates it dropped. :meth:`SymmetrySpec.explain
<wsym.group.spec.SymmetrySpec.explain>` prints them.
"""

from __future__ import annotations

from wsym.group.spec import leaves

DIAGONAL = {"scale": ("scaling", "norm_scaling"), "sign": ("sign",)}
NAMES = {"scale": "scaling", "sign": "sign"}
NO_SOLUTION = "its exponent relations through the graph have no nonzero solution"


def class_pins(ctx, st, wanted: set) -> dict:
    """``{(system, leaf class): op}``: the first operation fixing an exponent in that class."""
    out: dict = {}
    for system, atom, op in ctx.pins:
        for _, c, _ in st.leaves(atom):
            if c in wanted and op:
                out.setdefault((system, c), op)
    return out


def notes(ctx, st, groups, layouts) -> tuple[tuple[str, int, str], ...]:
    """``(param, dim, text)`` for every kind missing on a parameter axis (see the module doc)."""
    kinds: dict = {}
    for g in groups:
        kinds.setdefault(g.cls, set()).add(g.kind)
    wanted = {leaf.cls for _, dims in layouts for t in dims for leaf in leaves(t)}
    pins = class_pins(ctx, st, wanted)
    out = []
    for key, dims in layouts:
        for d, tree in enumerate(dims):
            for leaf in leaves(tree):
                if leaf.size > 1:
                    out += [
                        (key, d, t)
                        for t in _missing(st, pins, leaf.cls, kinds.get(leaf.cls, set()))
                    ]
    return tuple(dict.fromkeys(out))


def _missing(st, pins, cls, present) -> list[str]:
    info = st.info[cls]
    out = []
    if info.blocked:
        out.append(f"no permutation or mixing: {info.blocked}")
    elif not present & {"gl", "orthogonal"}:
        blame = st.atoms.blame.get(cls, {})
        why = blame.get("gl") or blame.get("orth")
        if info.conflict:
            out.append("no GL or orthogonal maps: the axis is coupled with itself transposed")
        elif why:
            out.append(f"no GL or orthogonal maps: {why} is not linear along it")
    if present & {"gl", "orthogonal"}:
        return out
    for system, found in DIAGONAL.items():
        if not present & set(found):
            op = pins.get((system, cls))
            reason = f"{op} fixes the {system}" if op else info.blocked or NO_SOLUTION
            out.append(f"no {NAMES[system]}: {reason}")
    return out
