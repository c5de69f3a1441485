"""Rules for elementwise activations, audited against each function's definition.

Along every axis an elementwise ``f`` commutes with permutations. Diagonal
actions survive only where ``f`` commutes with them:

* positively homogeneous, ``f(s x) = s f(x)`` for every ``s > 0``: ReLU,
  LeakyReLU, ``clamp(x, min=0)``. ReLU6 and ``hardtanh(x, 0, 6)`` are *not*
  (``relu6(2 * 5) = 6 != 2 * relu6(5)``), whatever their in-place spelling;
* odd, ``f(-x) = -f(x)``: tanh, sin, erf, ..., and ``hardtanh``/``clamp`` with
  bounds ``(-c, c)``;
* anything else (GELU, sigmoid, ReLU6, ``clamp(x, 0, 6)``, ...) is *generic*:
  neither scales nor signs pass, only permutations.

Binary forms are read jointly: ``maximum(a, b)`` and ``minimum(a, b)`` are
positively homogeneous in the pair (``max(s a, s b) = s max(a, b)``), so
``maximum(x, 0)``, ``maximum(x, 0.1 x)`` rescale like ReLU and LeakyReLU, and
``where(mask, a, b)`` is linear in ``(a, b)`` for a fixed mask; a comparison
``x > 0`` gives a mask invariant under positive scales of ``x`` (``x > c`` for
``c != 0`` under none). Operands constant along an axis pin it.

None of them commutes with GL or orthogonal mixing. Arguments decide for the
clamp family, so their rules read them; extra tensor operands (``clamp`` with
tensor bounds, ``maximum``, ``where``) are coupled elementwise and may not move
diagonally. :func:`claims` lists what the tables assert, for the test that
checks every entry numerically at saturating inputs.

Example:
    >>> import torch
    >>> from wsym.detect.rules.activation import claims
    >>> claims()["aten::relu"], claims()["aten::relu6"], claims()["aten::tanh"]
    ('homogeneous', 'generic', 'odd')
"""

from __future__ import annotations

import math

from wsym.detect.context import Context
from wsym.detect.rules.common import NONLINEAR, arg, broadcast, constant_along, is_tensor, shape


def _couple(ctx: Context, node, scale: str, sign: str) -> None:
    """Output moves with the first operand (``scale``/``sign`` relations); others are pinned."""
    tensors = [a for a in (*node.args, *node.kwargs.values()) if is_tensor(a)]
    x = node.args[0]
    if not is_tensor(x) or shape(x) != shape(node):  # a number first, or broadcast: generic
        ctx.layouts[node.name] = broadcast(
            ctx, node, tensors, scale="zero", sign="zero", breaks=NONLINEAR
        )
        return
    out = ctx.like(ctx.layouts[x.name])
    for do, dx in zip(out, ctx.layouts[x.name], strict=True):
        ctx.couple(do, dx, scale=scale, sign=sign, breaks=NONLINEAR)
    for t in tensors:  # bounds, masks, second operands: permute alike, never rescale
        if t is x:
            continue
        offset = len(shape(node)) - len(shape(t))
        for i, dim in enumerate(ctx.layouts[t.name]):
            if shape(t)[i] > 1:
                ctx.couple(out[offset + i], dim, scale="zero", sign="zero", breaks=NONLINEAR)
    ctx.layouts[node.name] = out


def homogeneous(ctx: Context, node) -> None:
    """``f(s x) = s f(x)`` for ``s > 0`` (ReLU, LeakyReLU)."""
    _couple(ctx, node, "eq", "zero")


def odd(ctx: Context, node) -> None:
    """``f(-x) = -f(x)`` (tanh, sin, erf)."""
    _couple(ctx, node, "zero", "eq")


def generic(ctx: Context, node) -> None:
    """Only permutations commute (GELU, sigmoid, exp, softmax, ReLU6, ...)."""
    _couple(ctx, node, "zero", "zero")


def _bounded(lo, hi) -> str:
    """Kind of ``clamp(x, lo, hi)`` for number (or None) bounds."""
    if any(is_tensor(b) for b in (lo, hi)):
        return "generic"
    lo = -math.inf if lo is None else float(lo)
    hi = math.inf if hi is None else float(hi)
    if lo == 0 and hi == math.inf:
        return "homogeneous"  # max(x, 0)
    if lo == -hi:
        return "odd"  # includes the identity (-inf, inf)
    return "generic"


KINDS = {"homogeneous": homogeneous, "odd": odd, "generic": generic}


def hardtanh(ctx: Context, node) -> None:
    """hardtanh(x, min_val=-1, max_val=1) = clamp(x, min_val, max_val)."""
    kind = _bounded(arg(node, 1, "min_val", -1.0), arg(node, 2, "max_val", 1.0))
    KINDS[kind](ctx, node)


def clamp(ctx: Context, node) -> None:
    """clamp(x, min=None, max=None); clamp_min(x, min); clamp_max(x, max)."""
    name = node.target._schema.name
    if name == "aten::clamp_min":
        lo, hi = arg(node, 1, "min"), None
    elif name == "aten::clamp_max":
        lo, hi = None, arg(node, 1, "max")
    else:
        lo, hi = arg(node, 1, "min"), arg(node, 2, "max")
    KINDS[_bounded(lo, hi)](ctx, node)


def glu(ctx: Context, node) -> None:
    """glu(x, dim) = a * sigmoid(b) with ``x = cat(a, b)`` along ``dim``: unit j reads a_j, b_j."""
    x = node.args[0]
    lx = list(ctx.layouts[x.name])
    dim = arg(node, 1, "dim", -1) % len(lx)
    n = shape(node)[dim]
    out = ctx.like(lx)
    out[dim] = ctx.fresh((n,))[0]
    for i, (do, dx) in enumerate(zip(out, lx, strict=True)):
        halves = [ctx.segment(dx, 0, n), ctx.segment(dx, n, 2 * n)] if i == dim else [dx]
        for h in halves:
            ctx.couple(do, h, scale="zero", sign="zero", breaks=NONLINEAR)
    ctx.layouts[node.name] = out


def prelu(ctx: Context, node) -> None:
    """prelu(x, w) = max(x, 0) + w min(x, 0), ``w`` one slope per channel (axis 1) or shared.

    Positively homogeneous in ``x`` for fixed slopes: channels rescale and permute
    (their slopes permute with them, and never rescale).
    """
    x, w = node.args[0], node.args[1]
    lx = ctx.layouts[x.name]
    out = ctx.like(lx)
    for do, dx in zip(out, lx, strict=True):
        ctx.couple(do, dx, scale="eq", sign="zero", breaks=NONLINEAR)
    wide = [i for i, n in enumerate(shape(w)) if n > 1]
    if wide:  # slopes permute with their channels, never rescale
        # prelu's 1-D slopes are per channel (axis 1); _prelu_kernel's broadcast to x
        i = wide[0]
        at = (1 if len(out) > 1 else 0) if len(shape(w)) == 1 else i + len(out) - len(shape(w))
        lw = ctx.layouts[w.name][i]
        ctx.couple(out[at], lw, scale=None, sign=None)
        for system in ("scale", "sign"):
            ctx.relate(system, [lw], (1,))
    ctx.layouts[node.name] = out


def _joint(ctx: Context, node, values, sign: str) -> list:
    """Output moving with every tensor in ``values`` alike; constant operands pin an axis."""
    out = broadcast(ctx, node, values, scale="eq", sign=sign, breaks=NONLINEAR)
    for pos, dim in enumerate(out):
        if constant_along(values, pos, shape(node)):
            for system in ("scale", "sign"):
                ctx.relate(system, [dim], (1,))
    return out


def extremum(ctx: Context, node) -> None:
    """Maximum / minimum / fmax / fmin (a, b): jointly positively homogeneous."""
    ctx.layouts[node.name] = _joint(ctx, node, node.args[:2], sign="zero")


def where(ctx: Context, node) -> None:
    """where(mask, a, b): linear in ``(a, b)``; the mask permutes along and never moves."""
    mask, values = node.args[0], node.args[1:3]
    out = _joint(ctx, node, values, sign="eq")
    offset = len(out) - len(shape(mask))
    for i, dim in enumerate(ctx.layouts[mask.name]):
        if shape(mask)[i] > 1:
            ctx.couple(out[offset + i], dim, scale=None, sign=None, breaks=NONLINEAR)
    ctx.layouts[node.name] = out


def compare(ctx: Context, node) -> None:
    """X > c, x <= y, ...: a mask (exponent 0) permuting with its operands.

    ``x > 0`` is invariant under a positive scale of ``x``; a nonzero bound, a
    second tensor or a sign flip changes it, so those pin ``x``.
    """
    x, y = node.args[0], node.args[1]
    tensors = [t for t in (x, y) if is_tensor(t)]
    out = broadcast(ctx, node, tensors, scale=None, sign=None, breaks=NONLINEAR)
    for dim in out:
        for system in ("scale", "sign"):
            ctx.relate(system, [dim], (1,))
    for t in tensors:
        for i, dim in enumerate(ctx.layouts[t.name]):
            if shape(t)[i] > 1:
                ctx.relate("sign", [dim], (1,))
                if is_tensor(y) or y != 0:
                    ctx.relate("scale", [dim], (1,))
    ctx.layouts[node.name] = out


HOMOGENEOUS = ["relu", "leaky_relu"]
ODD = ["tanh", "sin", "asinh", "atan", "sinh", "erf", "tan", "asin", "atanh", "erfinv"]
GENERIC = [
    "gelu",
    "silu",
    "sigmoid",
    "exp",
    "log",
    "softplus",
    "elu",
    "selu",
    "celu",
    "mish",
    "hardswish",
    "hardsigmoid",
    "cos",
    "sqrt",
    "rsqrt",
    "abs",
    "sign",
    "relu6",
    "reciprocal",
    "square",
    "logsigmoid",
    "gelu_tanh",
    "log1p",
    "expm1",
    "cosh",
    "floor",
    "ceil",
    "round",
    "trunc",
    "frac",
    "exp2",
    "log2",
    "log10",
    "acos",
    "hardshrink",
    "softshrink",
    "tanhshrink",
    "threshold",
    "lerp",
    "atan2",
    "remainder",
    "fmod",
    "floor_divide",
]
BOUNDED = {"hardtanh": hardtanh, "clamp": clamp, "clamp_min": clamp, "clamp_max": clamp}


def claims() -> dict[str, str]:
    """``{"aten::name": "homogeneous" | "odd" | "generic"}`` for the fixed-kind tables."""
    out = {f"aten::{n}": "homogeneous" for n in HOMOGENEOUS}
    out.update({f"aten::{n}": "odd" for n in ODD})
    out.update({f"aten::{n}": "generic" for n in GENERIC})
    return out


RULES = {name: KINDS[kind] for name, kind in claims().items()}
RULES.update({f"aten::{n}": rule for n, rule in BOUNDED.items()})
RULES.update({f"aten::{n}": extremum for n in ("maximum", "minimum", "fmax", "fmin")})
RULES["aten::where"] = where
MASKS = {f"aten::{n}": compare for n in ("gt", "ge", "lt", "le")}
RULES.update(MASKS)
RULES["aten::glu"] = glu
RULES["aten::prelu"] = prelu
RULES["aten::_prelu_kernel"] = prelu
