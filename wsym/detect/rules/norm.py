"""Rules for normalization layers.

BatchNorm in eval mode is a per-channel affine map with stored statistics:
scaling a channel's input by ``s`` together with ``running_mean`` (by ``s``),
``running_var`` (by ``s**2``) and ``weight`` (by ``sqrt(s**2 v + eps) / (s sqrt(v + eps))``)
leaves it exactly unchanged (``norm_scaling``); its affine output can be rescaled
like any unit. LayerNorm, GroupNorm and RMSNorm normalize across units, so only
permutations act on their normalized axes (RMSNorm without weight: orthogonal maps).
"""

from __future__ import annotations

from wsym.detect.context import Context
from wsym.detect.rules.common import NONLINEAR, arg, is_tensor, shape
from wsym.detect.rules.linear import _affine_leading


def _outputs(ctx: Context, node, out) -> None:
    val = node.meta["val"]
    if isinstance(val, list | tuple):
        extra = [ctx.fresh(tuple(v.shape), "normalization statistics") for v in val[1:]]
        ctx.layouts[node.name] = [out, *extra]
    else:
        ctx.layouts[node.name] = out


def batch_norm(ctx: Context, node, training: bool, eps: float) -> None:
    x, w, b, rm, rv = (
        arg(node, i, n)
        for i, n in enumerate(("input", "weight", "bias", "running_mean", "running_var"))
    )
    lx = ctx.layouts[x.name]
    out = ctx.like(lx)
    for i, (do, dx) in enumerate(zip(out, lx, strict=True)):
        if i != 1:
            ctx.couple(do, dx)
    _affine_leading(ctx, [d for i, d in enumerate(out) if i != 1 and shape(x)[i] > 1])
    xc, oc = lx[1], out[1]
    ctx.couple(oc, xc, scale=None, sign=None, breaks=NONLINEAR)
    if is_tensor(w):
        ctx.couple(oc, ctx.layouts[w.name][0], sign=None)
        ctx.relate("sign", [ctx.layouts[w.name][0], oc, xc], (1, 1, 1))
    else:
        ctx.relate("sign", [oc, xc], (1, 1))
        ctx.relate("scale", [oc], (1,))
    if is_tensor(b):
        ctx.couple(oc, ctx.layouts[b.name][0])
    for stat, power in ((rm, 1), (rv, 2)):
        if is_tensor(stat):
            ctx.allowed_buffers.add(stat.name)
            ctx.couple(xc, ctx.layouts[stat.name][0], scale=None, sign=None)
            ctx.relate("scale", [ctx.layouts[stat.name][0], xc], (1, -power))
            ctx.relate("sign", [ctx.layouts[stat.name][0], xc], (1, -power))
    if training or not is_tensor(rv) or (not is_tensor(w) and eps > 0):
        ctx.relate("scale", [xc], (1,))
    elif eps > 0:
        ctx.bn_corrections.append((w.name, rv.name, xc, eps))
    _outputs(ctx, node, out)


def batch_norm_eval(ctx: Context, node) -> None:
    """_native_batch_norm_legit_no_training(x, w, b, rm, rv, momentum, eps)."""
    batch_norm(ctx, node, training=False, eps=float(arg(node, 6, "eps", 1e-5)))


def batch_norm_generic(ctx: Context, node) -> None:
    """batch_norm, native_batch_norm, _native_batch_norm_legit.

    Arguments: (x, w, b, running_mean, running_var, training, momentum, eps).
    """
    batch_norm(
        ctx, node, training=bool(arg(node, 5, "training")), eps=float(arg(node, 7, "eps", 1e-5))
    )


def _normalize(ctx: Context, node, nshape, affine, breaks) -> None:
    """Normalization over the trailing ``nshape`` axes with optional elementwise ``affine``.

    Its input may move only as ``breaks`` allows (nothing diagonal: the statistics
    mix units); its output moves with the affine parameters, or not at all.
    """
    lx = ctx.layouts[node.args[0].name]
    lead = len(lx) - len(nshape)
    out = ctx.like(lx)
    for i, (do, dx) in enumerate(zip(out, lx, strict=True)):
        if i < lead:
            ctx.couple(do, dx, scale="zero", sign="zero", breaks=NONLINEAR)
        else:
            ctx.couple(do, dx, scale=None, sign=None, breaks=breaks)
            ctx.relate("scale", [dx], (1,))
            ctx.relate("sign", [dx], (1,))
    ctx.event(lx[lead:], [lx])
    params = [p for p in affine if is_tensor(p)]
    for p in params:
        for do, dp in zip(out[lead:], ctx.layouts[p.name], strict=True):
            ctx.couple(do, dp)
    if not is_tensor(affine[0]):  # no weight: the output cannot be rescaled
        for do in out[lead:]:
            ctx.relate("scale", [do], (1,))
            ctx.relate("sign", [do], (1,))
    _outputs(ctx, node, out)


def layer_norm(ctx: Context, node) -> None:
    """layer_norm(x, normalized_shape, w, b, eps): permutations only on normalized axes."""
    affine = (arg(node, 2, "weight"), arg(node, 3, "bias"))
    _normalize(ctx, node, node.args[1], affine, NONLINEAR)


def rms_norm(ctx: Context, node) -> None:
    """rms_norm(x, normalized_shape, w, eps): orthogonal on the normalized axes if no weight."""
    nshape, w = node.args[1], arg(node, 2, "weight")
    breaks = NONLINEAR if is_tensor(w) or len(nshape) > 1 else ("gl",)
    _normalize(ctx, node, nshape, (w,), breaks)


def group_norm(ctx: Context, node) -> None:
    """group_norm(x, G, w, b, eps): the channels of each group permute, one S_k per group.

    With one channel per group (``G = C``) the groups themselves permute.
    """
    x = node.args[0]
    if node.target._schema.name == "aten::native_group_norm":  # (x, w, b, N, C, HxW, G, eps)
        groups, w, b = node.args[6], node.args[1], node.args[2]
    else:
        groups, w, b = node.args[1], arg(node, 2, "weight"), arg(node, 3, "bias")
    lx = ctx.layouts[x.name]
    out = ctx.like(lx)
    k = shape(x)[1] // groups
    if k == 1:
        split = [ctx.new(groups)] if groups > 1 else []
    else:
        split = [ctx.concat([[ctx.new(k)] for _ in range(groups)])] if groups > 1 else [ctx.new(k)]
    for i, (do, dx) in enumerate(zip(out, lx, strict=True)):
        ctx.couple(
            do, dx, scale="zero" if i else "eq", sign="zero" if i else "eq", breaks=NONLINEAR
        )
    ctx.couple(lx[1], split, scale=None, sign=None)
    ctx.relate("scale", [lx[1]], (1,))
    ctx.relate("sign", [lx[1]], (1,))
    for p in (w, b):
        if is_tensor(p):
            ctx.couple(out[1], ctx.layouts[p.name][0])
    if not is_tensor(w):
        ctx.relate("scale", [out[1]], (1,))
    _outputs(ctx, node, out)


def instance_norm(ctx: Context, node) -> None:
    """instance_norm(x, w, b, running_mean, running_var, use_input_stats, momentum, eps).

    Per channel like BatchNorm: with its own statistics (``use_input_stats``) it
    normalizes each channel of each sample, so channels permute and flip sign
    with the weight, never rescale (eps); with running statistics it is BatchNorm in eval mode.
    """
    training = bool(arg(node, 5, "use_input_stats", True))
    batch_norm(ctx, node, training=training, eps=float(arg(node, 7, "eps", 1e-5)))


def weight_norm(ctx: Context, node) -> None:
    """_weight_norm(v, g, dim): ``w = g v / ||v||``, the norm over every axis but ``dim``.

    Along ``dim`` each slice rescales with ``g`` (``v`` is free there: its scale
    cancels) and flips sign with ``g v``; along the other axes ``v`` and ``w``
    permute and flip alike, and never rescale (the norm would change).
    """
    v, g = node.args[0], node.args[1]
    dim = arg(node, 2, "dim", 0)
    lv, lg = ctx.layouts[v.name], ctx.layouts[g.name]
    out = ctx.like(lv)
    keep = dim % len(lv) if dim is not None and dim != -1 else None
    for i, (do, dv) in enumerate(zip(out, lv, strict=True)):
        if i != keep:
            ctx.couple(do, dv, scale="zero", sign="eq", breaks=NONLINEAR)
            continue
        ctx.couple(do, dv, scale=None, sign=None, breaks=NONLINEAR)
        ctx.couple(do, lg[i], scale="eq", sign=None, breaks=NONLINEAR)
        ctx.relate("sign", [do, dv, lg[i]], (1, 1, 1))
    ctx.layouts[node.name] = out


RULES = {
    "aten::_native_batch_norm_legit_no_training": batch_norm_eval,
    "aten::batch_norm": batch_norm_generic,
    "aten::native_batch_norm": batch_norm_generic,
    "aten::_native_batch_norm_legit": batch_norm_generic,
    "aten::layer_norm": layer_norm,
    "aten::native_layer_norm": layer_norm,
    "aten::rms_norm": rms_norm,
    "aten::group_norm": group_norm,
    "aten::instance_norm": instance_norm,
    "aten::_weight_norm": weight_norm,
    "aten::native_group_norm": group_norm,
}
