"""Helpers shared by the rules: argument access and broadcasting."""

from __future__ import annotations

import torch.fx

from wsym.detect.context import Context

NONLINEAR = ("gl", "orth")  # the continuous groups no elementwise nonlinearity commutes with


def shape(node) -> tuple[int, ...]:
    """Static shape of a traced tensor node (or of a Python number: ``()``)."""
    if not isinstance(node, torch.fx.Node):
        return ()
    val = node.meta.get("val")
    return tuple(int(s) for s in val.shape)


def arg(node: torch.fx.Node, i: int, name: str, default=None):
    """Positional-or-keyword argument ``i``/``name`` of a call node."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


def is_tensor(x) -> bool:
    return isinstance(x, torch.fx.Node) and hasattr(x.meta.get("val"), "shape")


def is_square(node) -> bool:
    """``x ** 2`` or ``x * x``."""
    name = getattr(getattr(node, "target", None), "_schema", None)
    name = name.name if name is not None else ""
    if name == "aten::pow" and not is_tensor(node.args[1]) and node.args[1] == 2:
        return True
    return name == "aten::mul" and len(node.args) > 1 and node.args[0] is node.args[1]


def norm_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def broadcast(ctx: Context, node, inputs, scale="eq", sign="eq", breaks=()) -> list:
    """Output layout of an elementwise op: couple every non-broadcast input axis."""
    out_shape = shape(node)
    full = [x for x in inputs if is_tensor(x) and shape(x) == out_shape]
    out = ctx.like(ctx.layouts[full[0].name]) if full else ctx.fresh(out_shape)
    for x in inputs:
        if not is_tensor(x):
            continue
        lay = ctx.layouts[x.name]
        offset = len(out_shape) - len(lay)
        for i, dim in enumerate(lay):
            if shape(x)[i] > 1:
                ctx.couple(out[offset + i], dim, scale=scale, sign=sign, breaks=breaks)
    return out


ZEROS = ("aten::zeros", "aten::new_zeros", "aten::zeros_like", "aten::zero", "aten::zero_")
FILLS = {"aten::full": 1, "aten::new_full": 2, "aten::full_like": 1, "aten::scalar_tensor": 0}


def _schema_name(node) -> str:
    schema = getattr(getattr(node, "target", None), "_schema", None)
    return schema.name if schema is not None else ""


def is_zero(node) -> bool:
    """Whether ``node`` creates a tensor of zeros (``zeros``, ``full(..., 0)``, ...)."""
    name = _schema_name(node)
    if name in ZEROS:
        return True
    return name in FILLS and len(node.args) > FILLS[name] and node.args[FILLS[name]] == 0


def constant_along(operands, pos: int, out_shape) -> bool:
    """Whether some operand is constant along output axis ``pos`` (a nonzero number, broadcast).

    A tensor of zeros made in the graph (``scalar_tensor(0.)``, as a recorded
    ``where(m, x, 0.)`` reads) counts as the number 0.
    """
    if out_shape[pos] == 1:
        return False
    for t in operands:
        if not is_tensor(t) or is_zero(t):
            if not is_tensor(t) and t != 0:
                return True
            continue
        i = pos - (len(out_shape) - len(shape(t)))
        if i < 0 or shape(t)[i] == 1:
            return True
    return False
