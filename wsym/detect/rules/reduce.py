"""Rules for reductions and pooling."""

from __future__ import annotations

import re

from wsym.detect.context import Context
from wsym.detect.rules.common import NONLINEAR, arg, is_square, norm_dim, shape


def _reduce(linear: bool, invariant: str = ""):
    """Reductions over ``dim``; ``invariant`` names the continuous group it is invariant to."""

    def rule(ctx: Context, node, dim_at: int = 1) -> None:
        x = node.args[0]
        lx, in_shape = ctx.layouts[x.name], shape(x)
        dims = arg(node, dim_at, "dim", None)
        if dims is None or dims == []:
            dims = list(range(len(in_shape)))
        dims = {norm_dim(d, len(in_shape)) for d in ([dims] if isinstance(dims, int) else dims)}
        keep = arg(node, dim_at + 1, "keepdim", False)
        out_shape = shape(node)
        out = ctx.fresh(out_shape)
        j = 0
        for i, dx in enumerate(lx):
            if i in dims:
                squared = invariant or ("orth" if is_square(x) else "")
                ctx.mark(dx, *[k for k in NONLINEAR if k != squared])
                ctx.event([dx], [lx])
                for system in ("scale", "sign"):
                    ctx.relate(system, [dx], (1,))
                j += keep
                continue
            ctx.couple(out[j], dx, sign="eq" if linear else "zero")
            if not linear:
                ctx.mark(dx, *NONLINEAR)
            j += 1
        val = node.meta["val"]
        ctx.layouts[node.name] = (
            [out, ctx.fresh(out_shape, "argmax indices")] if isinstance(val, tuple | list) else out
        )

    return rule


mean = _reduce(linear=True)  # linear in the kept axes
amax = _reduce(linear=False)  # max(s x) = s max(x) for s > 0 only
vector_norm = _reduce(linear=False, invariant="orth")  # |x Q| = |x|


def _sorted(dim_at: int):
    """Sort / topk along ``dim`` (argument ``dim_at``): the values see no order of the axis.

    A permutation of the sorted axis leaves the sorted values unchanged; its
    scales and signs are pinned and no mixing passes (the order of ``s x`` is not
    the order of ``x``). The kept axes pass as through a maximum (positive scales).
    The output's sorted axis is a new axis, blocked; where the indices are read,
    the input's sorted axis is blocked too (they move with a permutation).
    """

    def rule(ctx: Context, node) -> None:
        x = node.args[0]
        lx, in_shape = ctx.layouts[x.name], shape(x)
        d = norm_dim(arg(node, dim_at, "dim", -1), len(in_shape))
        out_shape = tuple(node.meta["val"][0].shape)
        read = any(u.args[1] == 1 and u.users for u in node.users)
        if read:
            ctx.block_dim(lx[d], "sort indices are read")
        else:
            ctx.mark(lx[d], *NONLINEAR)
            ctx.event([lx[d]], [lx])
            for system in ("scale", "sign"):
                ctx.relate(system, [lx[d]], (1,))
        out = ctx.fresh(out_shape)
        for i, dx in enumerate(lx):
            if i == d:
                ctx.block_dim(out[i], "sorted axis")
                continue
            ctx.couple(out[i], dx, sign="zero")
            ctx.mark(dx, *NONLINEAR)
        ctx.layouts[node.name] = [out, ctx.fresh(out_shape, "sort indices")]

    return rule


def _pool(scale: str, sign: str):
    """Pooling over the trailing spatial axes; batch and channel axes pass through."""

    def rule(ctx: Context, node) -> None:
        x = node.args[0]
        lx = ctx.layouts[x.name]
        val = node.meta["val"]
        out_shape = tuple(val[0].shape) if isinstance(val, tuple | list) else shape(node)
        spatial = int(re.search(r"(\d)d", node.target._schema.name).group(1))
        out = ctx.fresh(out_shape)
        lead = len(lx) - spatial
        for i in range(lead):
            breaks = () if scale == "eq" and sign == "eq" else NONLINEAR
            ctx.couple(out[i], lx[i], scale=scale, sign=sign, breaks=breaks)
        for d in lx[lead:] + out[lead:]:
            ctx.block_dim(d, "pooled spatial axis")
        if isinstance(val, tuple | list):
            ctx.layouts[node.name] = [out, ctx.fresh(out_shape, "pooling indices")]
        else:
            ctx.layouts[node.name] = out

    return rule


RULES = {
    "aten::mean": mean,
    "aten::sum": mean,
    "aten::amax": amax,
    "aten::sort": _sorted(dim_at=1),  # sort(self, dim=-1, descending=False)
    "aten::topk": _sorted(dim_at=2),  # topk(self, k, dim=-1, largest=True, sorted=True)
}
REDUCTIONS = set(RULES)


def _norm(ctx: Context, node) -> None:
    """linalg_vector_norm(x, ord, dim, keepdim): the 2-norm is orthogonally invariant."""
    (vector_norm if arg(node, 1, "ord", 2) == 2 else amax)(ctx, node, dim_at=2)


RULES["aten::linalg_vector_norm"] = _norm
for _d in ("1d", "2d", "3d"):
    RULES[f"aten::max_pool{_d}"] = _pool("eq", "zero")
    RULES[f"aten::max_pool{_d}_with_indices"] = _pool("eq", "zero")
    RULES[f"aten::adaptive_max_pool{_d}"] = _pool("eq", "zero")
    RULES[f"aten::avg_pool{_d}"] = _pool("eq", "eq")
    RULES[f"aten::adaptive_avg_pool{_d}"] = _pool("eq", "eq")
