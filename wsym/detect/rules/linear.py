"""Rules for maps that contract axes: linear, matmul, einsum, convolution, embedding, attention.

A contraction couples the two contracted axes contragrediently (parity 1): any
invertible ``M`` applied as ``x M`` on one side and ``M^-1 y`` on the other cancels,
which is where GL symmetries come from. An axis carried by *both* factors of a
product (a batch axis of a bilinear map) only admits permutations and a diagonal
scale whose exponents add up.
"""

from __future__ import annotations

import string

from wsym.detect.context import Context
from wsym.detect.rules.common import NONLINEAR, arg, is_tensor, norm_dim, shape


def _affine_leading(ctx: Context, dims) -> None:
    """Axes along which a bias is broadcast: the map is affine there, not linear."""
    for d in dims:
        ctx.mark(d, *NONLINEAR)
        for system in ("scale", "sign"):
            ctx.relate(system, [d], (1,))


def linear(ctx: Context, node) -> None:
    """Y = x W^T + b."""
    x, w, b = node.args[0], node.args[1], arg(node, 2, "bias")
    lx, lw = ctx.layouts[x.name], ctx.layouts[w.name]
    out = ctx.like(lx[:-1]) + ctx.fresh(shape(node)[-1:])
    for do, dx in zip(out[:-1], lx[:-1], strict=True):
        ctx.couple(do, dx)
    ctx.couple(out[-1], lw[0])
    ctx.couple(lx[-1], lw[1], parity=1)
    ctx.event([lx[-1], lw[1]], [lx, lw])
    if is_tensor(b):
        ctx.couple(out[-1], ctx.layouts[b.name][0])
        _affine_leading(ctx, [d for d, n in zip(out[:-1], shape(node)[:-1], strict=True) if n > 1])
    ctx.layouts[node.name] = out


def einsum_rule(ctx: Context, node, equation: str, operands) -> None:
    """Couple axes by einsum letters; see the module docstring for the rules."""
    lhs, rhs = equation.replace(" ", "").split("->")
    specs = lhs.split(",")
    letters = iter(c for c in string.ascii_letters if c not in equation)
    ell = None
    for i, (spec, t) in enumerate(zip(specs, operands, strict=True)):
        if "..." in spec:
            n = len(shape(t)) - (len(spec) - 3)
            ell = ell or "".join(next(letters) for _ in range(max(n, len(shape(node)))))
            specs[i] = spec.replace("...", ell[len(ell) - n :] if n else "")
    if "..." in rhs:
        n = len(shape(node)) - (len(rhs) - 3)
        rhs = rhs.replace("...", ell[len(ell) - n :] if n else "")
    out = ctx.fresh(shape(node))
    occ: dict[str, list] = {}
    for spec, t in zip(specs, operands, strict=True):
        if len(set(spec)) != len(spec):
            ctx.block(ctx.layouts[t.name], f"einsum diagonal {equation}")
            ctx.layouts[node.name] = ctx.fresh(shape(node), f"einsum diagonal {equation}")
            return
        for ax, c in enumerate(spec):
            if shape(t)[ax] > 1:
                occ.setdefault(c, []).append(ctx.layouts[t.name][ax])
    for c, dims in occ.items():
        if c in rhs:
            o = out[rhs.index(c)]
            for d in dims:
                ctx.couple(o, d, scale=None, sign=None)
            if len(dims) > 1:
                ctx.mark(o, *NONLINEAR)
            for system in ("scale", "sign"):
                ctx.relate(system, [o, *dims], (1,) + (-1,) * len(dims))
        elif len(dims) == 2:
            ctx.couple(dims[0], dims[1], parity=1)
            ctx.event(dims, [ctx.layouts[t.name] for t in operands])
        else:
            for d in dims[1:]:
                ctx.couple(dims[0], d, scale=None, sign=None)
            ctx.mark(dims[0], *NONLINEAR)
            ctx.event(dims, [ctx.layouts[t.name] for t in operands])
            for system in ("scale", "sign"):
                ctx.relate(system, dims, (1,) * len(dims))
    ctx.layouts[node.name] = out


def einsum(ctx: Context, node) -> None:
    einsum_rule(ctx, node, node.args[0], node.args[1])


def matmul(ctx: Context, node) -> None:
    """Matmul / mm / bmm with numpy broadcasting of batch axes."""
    a, b = node.args[0], node.args[1]
    na, nb = len(shape(a)), len(shape(b))
    nbat = len(shape(node)) - (na >= 2) - (nb >= 2)
    batch = string.ascii_lowercase[:nbat]
    sa = batch[nbat - max(na - 2, 0) :] + ("NK" if na >= 2 else "K")
    sb = batch[nbat - max(nb - 2, 0) :] + ("KM" if nb >= 2 else "K")
    so = batch + ("N" if na >= 2 else "") + ("M" if nb >= 2 else "")
    # a batch axis broadcast (size 1) on one side is simply absent from that side
    einsum_rule(ctx, node, f"{sa},{sb}->{so}", [a, b])


def grouped_mm(ctx: Context, node) -> None:
    """``out[s] = x[s] @ W[e(s)]``: x ``(S, D)``, W ``(E, D, O)``, rows grouped by expert.

    The expert ``e(s)`` of a row is read from the offsets (routing data), so the
    expert axis of ``W`` is fixed here; ``D`` is contracted and ``O`` carried as
    in a linear map, one class for all experts (what one element applies to every
    expert alike; one group per expert is found afterwards, :mod:`wsym.detect.experts`).
    """
    x, w = node.args[0], node.args[1]
    lx, lw = ctx.layouts[x.name], ctx.layouts[w.name]
    if len(shape(x)) != 2 or len(shape(w)) != 3:
        ctx.block(lx, "grouped_mm with other than (S, D) x (E, D, O) operands")
        ctx.block(lw, "grouped_mm with other than (S, D) x (E, D, O) operands")
        ctx.layouts[node.name] = ctx.fresh(shape(node), "grouped_mm operands")
        return
    out = ctx.like(lx[:1]) + ctx.fresh(shape(node)[-1:])
    ctx.couple(out[0], lx[0])
    ctx.couple(out[1], lw[2])
    ctx.couple(lx[1], lw[1], parity=1)
    ctx.event([lx[1], lw[1]], [lx, lw])
    ctx.block_dim(lw[0], "the expert of each row is routing data (grouped_mm offsets)")
    extra = [t for t in (*node.args[2:], *node.kwargs.values()) if is_tensor(t)]
    for t in extra:  # offsets, and a bias this rule does not read
        ctx.block(ctx.layouts[t.name], "grouped_mm offsets or bias")
    ctx.layouts[node.name] = out


COPIES = ("aten::clone", "aten::detach", "aten::_to_copy", "aten::alias")


def vector_product(ctx: Context, node) -> None:
    """mv(A, v) / vdot(u, w), as matmul; vector operands permute and flip, never rescale.

    The vectors of spectral norm's power iteration (its buffers ``_u``, ``_v``,
    ``sigma = u^T W v``) move with the axis they are contracted with: permuting or
    flipping the rows of ``W`` with ``u`` (columns with ``v``) keeps ``sigma``, in
    eval mode and through the (equivariant) power iteration; rescaling would not
    survive the iteration's normalization.
    """
    matmul(ctx, node)
    for t in node.args[:2]:
        if len(shape(t)) == 1:
            src = t
            while (
                src.op == "call_function"
                and getattr(src.target, "_schema", None)
                and (src.target._schema.name in COPIES)
            ):
                src = src.args[0]
            ctx.allowed_buffers.add(src.name)
            ctx.relate("scale", [ctx.layouts[t.name][0]], (1,))


def addmm(ctx: Context, node) -> None:
    """addmm(bias, a, b) = bias + a @ b."""
    bias, a, b = node.args[:3]
    einsum_rule(ctx, node, "nk,km->nm", [a, b])
    out = ctx.layouts[node.name]
    lb = ctx.layouts[bias.name]
    if len(shape(bias)) == 1:
        ctx.couple(out[1], lb[0])
        _affine_leading(ctx, [out[0]])
    else:
        for do, db in zip(out, lb, strict=True):
            ctx.couple(do, db)


def tensordot(ctx: Context, node) -> None:
    a, b, da, db = node.args[:4]
    letters = iter(string.ascii_letters)
    sa = [next(letters) for _ in shape(a)]
    sb = [next(letters) for _ in shape(b)]
    for i, j in zip(da, db, strict=True):
        sb[norm_dim(j, len(sb))] = sa[norm_dim(i, len(sa))]
    contracted = {sa[norm_dim(i, len(sa))] for i in da}
    so = [c for c in sa + sb if c not in contracted]
    einsum_rule(ctx, node, f"{''.join(sa)},{''.join(sb)}->{''.join(so)}", [a, b])


def conv(ctx: Context, node) -> None:
    """conv1d/2d/3d and conv_transpose: channels are contracted; spatial and kernel axes blocked.

    ``groups = G`` splits the channels as ``(G, a)`` in and ``(G, b)`` out, and
    ``y[n, (g, j)] = sum_i W[(g, j), i] * x[n, (g, i)]``: ``g`` is a batch axis of a
    bilinear map (groups permute together, scales add up), ``i`` is contracted,
    ``j`` is the output unit. Depthwise convolution is ``a = b = 1``. A transposed
    convolution stores ``W`` as ``(C_in, C_out / G, ...)``: the same with the two
    channel axes of ``W`` swapped.
    """
    x, w, b = node.args[0], node.args[1], arg(node, 2, "bias")
    name = node.target._schema.name
    general = name == "aten::convolution"
    transposed = name.startswith("aten::conv_transpose") or (
        general and arg(node, 6, "transposed", False)
    )
    groups = arg(node, 8, "groups", 1) if general else arg(node, 6, "groups", 1)
    lx, lw = ctx.layouts[x.name], ctx.layouts[w.name]
    out_shape = shape(node)
    out = ctx.fresh(out_shape)
    ctx.couple(out[0], lx[0])
    for d in lx[2:] + lw[2:] + out[2:]:
        ctx.block_dim(d, "convolution spatial axis")
    w_in, w_out = (lw[0], lw[1]) if transposed else (lw[1], lw[0])
    cin, cout = shape(x)[1], out_shape[1]
    if groups == 1:
        ctx.couple(out[1], w_out)
        ctx.couple(lx[1], w_in, parity=1)
        ctx.event([lx[1], w_in], [lx, lw])
    else:
        _grouped(ctx, groups, cin // groups, cout // groups, lx[1], out[1], w_in, w_out, transposed)
    if is_tensor(b):
        ctx.couple(out[1], ctx.layouts[b.name][0])
        _affine_leading(ctx, [out[0]] + out[2:])
    ctx.layouts[node.name] = out


def _grouped(ctx: Context, groups, a, b, x_dim, out_dim, w_in, w_out, transposed) -> None:
    """Couple the channels of a grouped convolution (see :func:`conv`).

    ``W`` holds the group axis with its output units (``(G b, a)``), or, transposed,
    with its input units (``(G a, b)``).
    """

    def split(dim, inner):
        g = ctx.new(groups)
        k = ctx.new(inner) if inner > 1 else None
        ctx.couple(dim, [g] + ([k] if k is not None else []))
        return g, k

    gx, ix = split(x_dim, a)
    go, jo = split(out_dim, b)
    if transposed:
        gw, iw = split(w_in, a)
        jw = w_out[0] if w_out else None
    else:
        gw, jw = split(w_out, b)
        iw = w_in[0] if w_in else None
    for gg in (gx, gw):
        ctx.couple([go], [gg], scale=None, sign=None, breaks=NONLINEAR)
    for system in ("scale", "sign"):
        ctx.relate(system, [[go], [gx], [gw]], (1, -1, -1))
    if jo is not None:
        ctx.couple([jo], [jw])
    if ix is not None:  # (a = 1: W's input axis has size 1, nothing is contracted)
        ctx.couple([ix], [iw], parity=1)
        ctx.event([[ix], [iw]], [])


def embedding(ctx: Context, node) -> None:
    """embedding(W, idx): rows are looked up by integer index; features pass linearly."""
    w, idx = node.args[0], node.args[1]
    lw = ctx.layouts[w.name]
    ctx.block_dim(lw[0], "embedding vocabulary axis")
    out = ctx.fresh(shape(node))
    for do, di in zip(out[:-1], ctx.layouts[idx.name], strict=True):
        ctx.couple(do, di)
    ctx.couple(out[-1], lw[1])
    ctx.layouts[node.name] = out


def sdpa(ctx: Context, node) -> None:
    """scaled_dot_product_attention(q, k, v, mask): the classic head-wise GL source."""
    gqa = arg(node, 7, "enable_gqa", False)
    ctx.layouts[node.name] = _attention(
        ctx, node, arg(node, 3, "attn_mask"), arg(node, 4, "dropout_p", 0.0), gqa, shape(node)
    )


def sdpa_cpu(ctx: Context, node) -> None:
    """_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *, attn_mask).

    What ``scaled_dot_product_attention`` dispatches to on CPU (a recorded trace
    sees it); outputs ``(attention, logsumexp)``, the second read by nothing.
    """
    out_shape, lse_shape = (tuple(v.shape) for v in node.meta["val"][:2])
    mask = node.kwargs.get("attn_mask")
    # grouped-query attention reaches this kernel with fewer key/value heads than query heads
    out = _attention(ctx, node, mask, arg(node, 3, "dropout_p", 0.0), True, out_shape)
    ctx.layouts[node.name] = (out, ctx.fresh(lse_shape, "attention logsumexp"))


def _attention(ctx: Context, node, mask, dropout: float, gqa: bool, out_shape) -> list:
    """The layout of attention's output (q, k, v are the first three arguments)."""
    q, k, v = node.args[:3]
    if dropout:
        reason = "attention dropout in training mode"
        for t in (q, k, v):
            ctx.block(ctx.layouts[t.name], reason)
        return ctx.fresh(out_shape, reason)
    lq, lk, lv = (ctx.layouts[t.name] for t in (q, k, v))
    out = ctx.fresh(out_shape)
    nb = len(out_shape) - 2
    gqa = gqa and shape(k)[-3] > 1 and shape(q)[-3] != shape(k)[-3]  # one head broadcasts
    for pos in range(nb):
        dims = {}
        for name, t, lay in (("q", q, lq), ("k", k, lk), ("v", v, lv)):
            i = pos - (nb - (len(shape(t)) - 2))
            if i >= 0 and shape(t)[i] > 1:
                dims[name] = lay[i]
        if gqa and pos == nb - 1:
            _gqa_heads(ctx, out[pos], dims)
            continue
        for d in dims.values():
            ctx.couple(out[pos], d, scale=None, sign=None, breaks=NONLINEAR)
        # scores scale by e(q) + e(k), outputs by e(v); a broadcast operand has exponent 0
        qk = [dims[n] for n in ("q", "k") if n in dims]
        for system in ("scale", "sign"):
            if qk:
                ctx.relate(system, qk, (1,) * len(qk))
            if "v" in dims:
                ctx.relate(system, [out[pos], dims["v"]], (1, -1))
            else:
                ctx.relate(system, [out[pos]], (1,))
    ctx.couple(out[-2], lq[-2])
    ctx.couple(lk[-2], lv[-2], scale="zero", sign="zero", breaks=NONLINEAR)
    ctx.couple(lq[-1], lk[-1], parity=1)
    ctx.event([lq[-1], lk[-1]], [lq, lk])
    ctx.couple(out[-1], lv[-1])
    if is_tensor(mask):
        lm, ms = ctx.layouts[mask.name], shape(mask)
        scores = out[:-1] + [lk[-2]]
        for i, d in enumerate(lm):
            if ms[i] > 1:
                ctx.couple(scores[len(scores) - len(lm) + i], d, scale="zero", sign="zero")
    ctx.attentions.append(node)
    return out


def _gqa_heads(ctx: Context, out_dim, dims) -> None:
    """Grouped-query attention: query head h*g + j reads key/value head h."""
    hkv = ctx.dim_size(dims["k"])
    g = ctx.dim_size(dims["q"]) // hkv
    q_split = [ctx.new(hkv), ctx.new(g)]
    ctx.couple(dims["q"], q_split, scale=None, sign=None, breaks=NONLINEAR)
    ctx.couple(out_dim, q_split, scale=None, sign=None, breaks=NONLINEAR)
    ctx.couple([q_split[0]], dims["k"], scale=None, sign=None, breaks=NONLINEAR)
    ctx.couple([q_split[0]], dims["v"], scale=None, sign=None, breaks=NONLINEAR)
    for d in (dims["q"], dims["k"], dims["v"], out_dim):
        for system in ("scale", "sign"):
            ctx.relate(system, [d], (1,))


RULES = {
    "aten::linear": linear,
    "aten::matmul": matmul,
    "aten::mm": matmul,
    "aten::bmm": matmul,
    "aten::_grouped_mm": grouped_mm,
    "transformers::grouped_mm_fallback": grouped_mm,
    "aten::addmm": addmm,
    "aten::mv": vector_product,
    "aten::vdot": vector_product,
    "aten::dot": vector_product,
    "aten::einsum": einsum,
    "aten::tensordot": tensordot,
    "aten::conv1d": conv,
    "aten::conv2d": conv,
    "aten::conv3d": conv,
    "aten::convolution": conv,
    "aten::conv_transpose1d": conv,
    "aten::conv_transpose2d": conv,
    "aten::conv_transpose3d": conv,
    "aten::embedding": embedding,
    "aten::scaled_dot_product_attention": sdpa,
    "aten::_scaled_dot_product_flash_attention_for_cpu": sdpa_cpu,
}
