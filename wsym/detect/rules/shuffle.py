"""Channel shuffles: ``channel_shuffle(x, g)`` and its spelled-out ``view``/``transpose``/``view``.

A shuffle of an axis of ``C = g k`` entries viewed as ``(g, k)`` moves entry
``(i, j)`` to ``(j, i)``: position ``j g + i`` holds channel ``i k + j``. Its
output axis is its input's class seen through that relabeling
(:mod:`wsym.detect.relabel`), so that a permutation of the ``C`` channels before
the shuffle is matched by the conjugate one after it (``S_C``, and ``GL(C)``
where nothing else is in the way); a split input (concatenated classes) is seen
through the relabeling as a whole. Where the input axis is not one atom, or the
merge does not hold (the shuffle is then in ``ctx.factored``), the
``(g, k)`` factors are coupled and permute separately (``S_g x S_k``).

torchvision's ShuffleNet spells the shuffle as ``view(B, g, k, H, W)``,
``transpose(1, 2)``, ``contiguous()``, ``view(B, C, H, W)``; :func:`view` reads
that chain as one shuffle, named by its first ``view``.
"""

from __future__ import annotations

from wsym.detect.context import Context, Dep
from wsym.detect.rules.common import _schema_name, norm_dim, shape
from wsym.detect.rules.shape import VIEWS
from wsym.detect.rules.shape import view as plain_view

COPIES = {"aten::clone", "aten::contiguous"}  # between the transpose and the last view


def channel_shuffle(ctx: Context, node) -> None:
    """``channel_shuffle(x, g)`` along axis 1."""
    x, g = node.args[0], int(node.args[1])
    ctx.layouts[node.name] = shuffled(ctx, node.name, ctx.layouts[x.name], 1, g, shape(x)[1])


def shuffled(ctx: Context, name: str, lx, d: int, g: int, c: int) -> list:
    """The layout of ``lx`` shuffled along axis ``d`` (``c = g k`` entries) by shuffle ``name``."""
    out = ctx.like(lx)
    for i, (do, dx) in enumerate(zip(out, lx, strict=True)):
        if i != d:
            ctx.couple(do, dx)
    k = c // g
    plain = _plain(ctx, lx[d])
    if name in ctx.factored or plain is None:
        out[d] = _factored(ctx, lx[d], g, k)
        return out
    out[d] = [ctx.new(c)]
    units = tuple(i * k + j for j in range(k) for i in range(g))
    ctx.relabels.append((out[d][0], plain, units, name))
    for system in ("scale", "sign"):
        ctx.relations.append((system, "lin", (plain, out[d][0]), (1, -1)))
    return out


def _plain(ctx: Context, dim) -> int | None:
    """The one atom of ``dim`` (more than one unit), or None."""
    atoms = [a for a in dim if isinstance(a, Dep) or ctx.atoms.size[a] > 1]
    if len(atoms) != 1 or isinstance(atoms[0], Dep):
        return None
    return atoms[0]


def _factored(ctx: Context, dim, g: int, k: int) -> list:
    """The output axis of a shuffle whose ``(g, k)`` factors are coupled apart."""
    factors = [[ctx.new(n)] if n > 1 else [] for n in (g, k)]
    ctx.couple(dim, factors[0] + factors[1])
    out = ctx.like([factors[1] + factors[0]])[0]
    ctx.couple(out[: len(factors[1])], factors[1])
    ctx.couple(out[len(factors[1]) :], factors[0])
    return out


def view(ctx: Context, node) -> None:
    """A view; the first of a spelled-out shuffle starts it, the last one ends it.

    Between them only the chain's own values flow (each has one user): they get
    fresh atoms that nothing else reads.
    """
    if node.name in ctx.shuffles:  # the chain's last view
        name, src, d, g = ctx.shuffles.pop(node.name)
        lx = ctx.layouts[src.name]
        ctx.layouts[node.name] = shuffled(ctx, name, lx, d, g, shape(src)[d])
        return
    chain = _chain(node)
    lx = ctx.layouts[node.args[0].name]
    if chain is None or node.name in ctx.factored or _plain(ctx, lx[chain[1]]) is None:
        plain_view(ctx, node)
        return
    last, d, g = chain
    ctx.shuffles[last.name] = (node.name, node.args[0], d, g)
    ctx.layouts[node.name] = ctx.fresh(shape(node))


def _chain(first) -> tuple | None:
    """``(last view, axis, g)`` where ``first`` starts a spelled-out shuffle, else None."""
    before, split = shape(first.args[0]), shape(first)
    d = next((i for i, (a, b) in enumerate(zip(before, split, strict=False)) if a != b), None)
    if d is None or len(split) != len(before) + 1 or split[:d] != before[:d]:
        return None
    if split[d + 2 :] != before[d + 1 :] or split[d] * split[d + 1] != before[d]:
        return None
    if 1 in split[d : d + 2]:  # one factor of 1: the transpose moves nothing
        return None
    node = _only_user(first)
    if node is None or _schema_name(node) != "aten::transpose":
        return None
    if sorted(norm_dim(a, len(split)) for a in node.args[1:3]) != [d, d + 1]:
        return None
    node = _only_user(node)
    while node is not None and _schema_name(node) in COPIES:
        node = _only_user(node)
    if node is None or _schema_name(node) not in VIEW_NAMES or shape(node) != before:
        return None
    return node, d, split[d]


def _only_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 and users[0].op == "call_function" else None


VIEW_NAMES = {f"aten::{n}" for n in VIEWS}
RULES = {f"aten::{n}": view for n in VIEWS}
RULES["aten::channel_shuffle"] = channel_shuffle
RULES["aten::native_channel_shuffle"] = channel_shuffle
