"""Rotary position embeddings: ``x * cos + rotate_half(x) * sin``.

With ``rotate_half(x) = cat(-x[..., d/2:], x[..., :d/2])`` the feature axis is
``d = (2, d/2)``: pair ``j`` is ``(x_j, x_{j+d/2})``, rotated by an angle that
depends on the position and the frequency ``j``. A rotation of each pair
commutes with that, so the query/key GL group shrinks to SO(2) per head and
frequency pair (the pair axis is the group's class, the frequency axis its
index); frequencies themselves cannot be permuted. The pattern is matched as a
whole before the walk, so its constant tables do not block the feature axis.
"""

from __future__ import annotations

import operator

import torch

from wsym.detect.context import Context
from wsym.detect.rules.common import is_tensor, norm_dim, shape


def _name(node) -> str:
    if getattr(node, "target", None) is operator.getitem:
        return "_operator::getitem"
    schema = getattr(getattr(node, "target", None), "_schema", None)
    return schema.name if schema is not None else ""


def _slice_of(node, ndim: int):
    """``(source, start, end)`` of a last-axis unit-step slice, else None."""
    if _name(node) != "aten::slice":
        return None
    args = list(node.args) + [None] * 5
    dim, start, end, step = args[1], args[2] or 0, args[3], args[4] or 1
    if norm_dim(dim if dim is not None else 0, ndim) != ndim - 1 or step != 1:
        return None
    return args[0], start, end


def _rotate_half(node):
    """The ``x`` of ``cat([-x[..., d/2:], x[..., :d/2]], -1)``, else None."""
    if _name(node) != "aten::cat" or len(node.args[0]) != 2:
        return None
    ndim = len(shape(node))
    if norm_dim(node.args[1] if len(node.args) > 1 else 0, ndim) != ndim - 1:
        return None
    first, second = node.args[0]
    if _name(first) != "aten::neg":
        return None
    hi, lo = _slice_of(first.args[0], ndim), _slice_of(second, ndim)
    if hi is None or lo is None or hi[0] is not lo[0]:
        return None
    d = shape(hi[0])[-1]
    if (
        d % 2
        or hi[1] != d // 2
        or (hi[2] is not None and hi[2] < d)
        or lo[1] != 0
        or lo[2] != d // 2
    ):
        return None
    return hi[0], [node, first, first.args[0], second]


def parameter_free(graph: torch.fx.Graph, params: set) -> set:
    """Names of nodes that do not depend on any parameter."""
    dependent = set(params)
    for node in graph.nodes:
        if any(s.name in dependent for s in node.all_input_nodes):
            dependent.add(node.name)
    return {n.name for n in graph.nodes} - dependent


def find_rotary(graph: torch.fx.Graph, free: set) -> tuple[dict, set]:
    """``{add node name: x node}`` for every rotary pattern, and the nodes inside them.

    ``free`` names the nodes that do not depend on parameters (the cos/sin tables).
    """
    found, inner = {}, set()
    for node in graph.nodes:
        if (
            _name(node) != "aten::add"
            or len(node.args) < 2
            or not all(is_tensor(a) for a in node.args[:2])
        ):
            continue
        for m1, m2 in (node.args[:2], node.args[1::-1]):
            if _name(m1) != "aten::mul" or _name(m2) != "aten::mul":
                continue
            match = _match(m1, m2, free)
            if match is not None:
                x, nodes = match
                if all(len(n.users) == 1 for n in nodes if n is not x):
                    found[node.name] = x
                    inner.update(n.name for n in nodes)
                break
    return found, inner


def _match(m1, m2, free):
    for x, c1 in (m1.args[:2], m1.args[1::-1]):
        for r, c2 in (m2.args[:2], m2.args[1::-1]):
            rot = _rotate_half(r) if is_tensor(r) else None
            if (
                rot is not None
                and rot[0] is x
                and is_tensor(c1)
                and is_tensor(c2)
                and c1.name in free
                and c2.name in free
                and shape(m1) == shape(x)
            ):
                return x, [m1, m2, *rot[1]]
    return None


def rotary(ctx: Context, node, x) -> None:
    """Output layout of a matched rotary embedding of ``x``."""
    lx = ctx.layouts[x.name]
    d = shape(x)[-1]
    out = ctx.like(lx)
    for do, dx in zip(out[:-1], lx[:-1], strict=True):
        ctx.couple(do, dx)
    pair, freq = ctx.new(2), ctx.new(d // 2)
    ctx.couple(lx[-1], [pair, freq], scale=None, sign=None)
    ctx.couple(out[-1], lx[-1], scale="zero", sign="zero", breaks=("gl", "reflection"))
    ctx.block_dim([freq], "rotary frequency axis")
    ctx.layouts[node.name] = out
