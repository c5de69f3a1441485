"""Classes seen through a fixed relabeling of their units (a channel shuffle).

A channel shuffle ``sigma`` moves channel ``sigma[k]`` of its input to position
``k`` of its output. Its output axis gets an atom of its own, recorded beside
its input atom as ``(output, input, sigma)`` (:attr:`Context.relabels
<wsym.detect.context.Context.relabels>`); the two are not coupled. Once the
graph is read, :func:`resolve` merges each output class into its input class,
whose leaves then carry the relabeling (:class:`~wsym.group.spec.Leaf`): a
permutation ``pi`` of the input channels is ``sigma^-1 pi sigma`` on the
output's positions, so the whole ``S_C`` acts, not only the ``S_g x S_{C/g}``
that coupling the shuffle's ``(g, C/g)`` factors expresses.

The input class may be split (a shuffle of ``cat(x1, branch(x2))``): the output
then holds the input's classes, concatenated and relabeled. The merge holds only
where the output class is unsplit (nothing slices the shuffled channels), does not
lie under the input's (through its splits and other merges: it would be relabeled
into itself), and is relabeled into no other class. A
record that breaks these is *unsound*: :func:`~wsym.detect.analyze.analyze`
reads the graph again with that shuffle factored (``S_g x S_{C/g}``), and a
record still unsound after the last pass blocks both classes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Relabel:
    """Class ``root`` is class ``target`` with position ``k`` holding unit ``units[k]``."""

    target: int
    units: tuple[int, ...]
    parity: int


def resolve(ctx) -> tuple[dict[int, Relabel], set[str]]:
    """``({class root: Relabel}, {names of the shuffles whose merge does not hold})``."""
    atoms = ctx.atoms
    edges: dict[int, tuple[int, tuple, int, str]] = {}
    unsound: set[str] = set()
    for out, inp, units, node in ctx.relabels:
        (rb, pb), (ra, pa) = atoms.find(out), atoms.find(inp)
        if rb in atoms.split or rb == ra or rb in edges or atoms.size[rb] != len(units):
            unsound.add(node)
            continue
        edges[rb] = (ra, units, pb ^ pa, node)
    for rb, (ra, _, _, node) in edges.items():  # a class relabeled into (a part of) itself
        if _reaches(atoms, edges, ra, rb):
            unsound.add(node)
    edges = {c: e for c, e in edges.items() if e[3] not in unsound}
    return {rb: _follow(edges, rb) for rb in edges}, unsound


def _reaches(atoms, edges: dict, start: int, goal: int) -> bool:
    """Whether class ``goal`` lies under class ``start``, through splits and merges."""
    seen, stack = set(), [start]
    while stack:
        r = atoms.root(stack.pop())
        if r == goal:
            return True
        if r in seen:
            continue
        seen.add(r)
        if r in edges:
            stack.append(edges[r][0])
        stack.extend(atoms.split.get(r, (None, []))[1])
    return False


def _follow(edges: dict, r: int) -> Relabel:
    """The class at the end of ``r``'s chain of merges, with the relabelings composed."""
    units, parity = None, 0
    while r in edges:
        r, step, p, _ = edges[r]
        units = step if units is None else tuple(step[u] for u in units)
        parity ^= p
    return Relabel(r, units, parity)


def block_unsound(ctx, unsound: set[str]) -> None:
    """Block (and pin the exponents of) both sides of each unsound shuffle (the last pass)."""
    for out, inp, _, node in ctx.relabels:
        if node in unsound:
            reason = f"channel shuffle ({node}) of a split or coupled class"
            for a in (out, inp):
                ctx.atoms.block(a, reason)
                for system in ("scale", "sign"):
                    ctx.relations.append((system, "lin", (a,), (1,)))
