"""Rules for elementwise arithmetic: sums, products, powers, softmax.

Sums and products by numbers are linear along every axis (affine, so only
permutations pass, where a constant is added); products of two tensors are
gating products whose exponents add up; ``x ** 2`` read only by sums keeps
orthogonal maps. Activations live in :mod:`wsym.detect.rules.activation`.
"""

from __future__ import annotations

from wsym.detect.context import Context
from wsym.detect.rules.activation import generic
from wsym.detect.rules.common import (
    NONLINEAR,
    arg,
    broadcast,
    constant_along,
    is_square,
    is_tensor,
    shape,
)
from wsym.detect.rules.reduce import REDUCTIONS


def square(ctx: Context, node) -> None:
    """X ** 2: orthogonal maps survive if every reader sums it over the transformed axes."""
    if not all(
        u.target._schema.name in REDUCTIONS for u in node.users if hasattr(u.target, "_schema")
    ):
        generic(ctx, node)
        return
    x = node.args[0]
    out = ctx.like(ctx.layouts[x.name])
    for do, dx in zip(out, ctx.layouts[x.name], strict=True):
        ctx.couple(do, dx, scale="zero", sign="zero", breaks=("gl",))
    ctx.layouts[node.name] = out


def pow_(ctx: Context, node) -> None:
    (square if is_square(node) else generic)(ctx, node)


def scalar_linear(ctx: Context, node) -> None:
    """neg, and arithmetic with a Python number: linear along every axis."""
    ctx.layouts[node.name] = broadcast(ctx, node, node.args)


def add(ctx: Context, node) -> None:
    """add/sub: every non-broadcast axis of every operand moves with the output.

    Along an axis where one operand is constant (broadcast, or a nonzero number),
    the sum is affine, not linear: only permutations survive there.
    """
    operands = node.args[:2]
    out = broadcast(ctx, node, operands)
    out_shape = shape(node)
    for pos, dim in enumerate(out):
        if constant_along(operands, pos, out_shape):
            ctx.mark(dim, *NONLINEAR)
            for system in ("scale", "sign"):
                ctx.relate(system, [dim], (1,))
    ctx.layouts[node.name] = out


def mul(ctx: Context, node) -> None:
    """mul/div: linear where one side is constant along the axis, a gating product elsewhere."""
    x, y = node.args[0], node.args[1]
    if arg(node, 2, "rounding_mode") is not None:  # floor/trunc division is not linear
        generic(ctx, node)
        return
    if not (is_tensor(x) and is_tensor(y)):
        ctx.layouts[node.name] = broadcast(ctx, node, node.args[:2])
        return
    if is_square(node):
        square(ctx, node)
        return
    out_shape = shape(node)
    sign_y = -1 if node.target.__name__.startswith("div") else 1
    out = broadcast(ctx, node, [x, y], scale=None, sign=None)
    for pos in range(len(out_shape)):
        dims = []
        for t in (x, y):
            i = pos - (len(out_shape) - len(shape(t)))
            dims.append(ctx.layouts[t.name][i] if i >= 0 and shape(t)[i] > 1 else None)
        dx, dy = dims
        if dx is not None and dy is not None:
            ctx.mark(out[pos], *NONLINEAR)
            for system in ("scale", "sign"):
                ctx.relate(system, [out[pos], dx, dy], (1, -1, -sign_y))
        elif dx is not None:
            for system in ("scale", "sign"):
                ctx.relate(system, [out[pos], dx], (1, -1))
        elif dy is not None:  # y varies alone: out = x * y, or x / y (nonlinear in y)
            if sign_y < 0:
                ctx.mark(out[pos], *NONLINEAR)
            for system in ("scale", "sign"):
                ctx.relate(system, [out[pos], dy], (1, -sign_y))
    ctx.layouts[node.name] = out


def softmax(ctx: Context, node) -> None:
    """Softmax / log_softmax: elementwise-generic on every axis, translation along its own."""
    generic(ctx, node)
    ctx.softmaxes.append((node, arg(node, 1, "dim", -1)))


RULES = {
    "aten::neg": scalar_linear,
}
RULES.update(
    {
        "aten::pow": pow_,
        "aten::add": add,
        "aten::sub": add,
        "aten::rsub": add,
        "aten::mul": mul,
        "aten::div": mul,
        "aten::softmax": softmax,
        "aten::_softmax": softmax,
        "aten::log_softmax": softmax,
        "aten::_log_softmax": softmax,
    }
)

__all__ = ["RULES"]
