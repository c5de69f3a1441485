"""Rules for operations that move, reshape, slice or join axes without arithmetic."""

from __future__ import annotations

from wsym.detect.atoms import SplitConflict
from wsym.detect.context import Context, Dep
from wsym.detect.rules.common import (
    FILLS,
    NONLINEAR,
    _schema_name,
    arg,
    is_tensor,
    is_zero,
    norm_dim,
    shape,
)


def identity(ctx: Context, node) -> None:
    """Ops that return their first input's values (clone, dropout in eval, dtype casts)."""
    ctx.layouts[node.name] = list(ctx.layouts[node.args[0].name])


def restride(ctx: Context, node) -> None:
    """as_strided_(x, size, stride): identity where only the strides of size-1 axes change.

    Kernels restride their outputs in place (``mean`` over spatial axes with
    ``keepdim``); any other reinterpretation of the storage blocks.
    """
    x, size, stride = node.args[0], arg(node, 1, "size"), arg(node, 2, "stride")
    old = x.meta["val"]
    same = (
        tuple(size) == tuple(old.shape)
        and arg(node, 3, "storage_offset") in (None, old.storage_offset())
        and all(n == 1 or s == t for n, s, t in zip(size, stride, old.stride(), strict=True))
    )
    if not same:
        raise ValueError(f"as_strided_ to {tuple(size)} / {tuple(stride)} reinterprets the storage")
    identity(ctx, node)


def dropout(ctx: Context, node) -> None:
    """Dropout: identity in eval mode; a training-mode dropout is random and blocks."""
    if arg(node, 2, "train", False):
        ctx.layouts[node.name] = ctx.fresh(shape(node), "dropout in training mode")
        ctx.block(ctx.layouts[node.args[0].name], "dropout in training mode")
    else:
        identity(ctx, node)


def constant(ctx: Context, node) -> None:
    """Tensors created inside the graph (arange, ...): nothing acts on them.

    A tensor of zeros is the exception: every linear action maps it to itself, so
    its axes are free (an RNN's initial state, ``maximum(x, zeros_like(x))``). A
    tensor filled with one value (``ones_like``, ``full``) is unchanged by
    permutations only.
    """
    if is_zero(node):
        ctx.layouts[node.name] = ctx.fresh(shape(node))
    elif _schema_name(node) in FILLED:
        out = ctx.fresh(shape(node))
        for dim in out:
            ctx.mark(dim, *NONLINEAR)
            for system in ("scale", "sign"):
                ctx.relate(system, [dim], (1,))
        ctx.layouts[node.name] = out
    else:
        ctx.layouts[node.name] = ctx.fresh(shape(node), f"constant {node.target}")


FILLED = {*FILLS, "aten::ones", "aten::ones_like", "aten::new_ones"}


def _groups(in_shape, out_shape):
    """Pair runs of input dims with runs of output dims of equal product (size-1 dims aside)."""
    ins = [i for i, n in enumerate(in_shape) if n != 1]
    outs = [j for j, n in enumerate(out_shape) if n != 1]
    groups, i, j = [], 0, 0
    while i < len(ins) and j < len(outs):
        gi, gj = [ins[i]], [outs[j]]
        pi, pj = in_shape[ins[i]], out_shape[outs[j]]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(ins[i])
                pi *= in_shape[ins[i]]
                i += 1
            else:
                gj.append(outs[j])
                pj *= out_shape[outs[j]]
                j += 1
        groups.append((gi, gj))
    return groups


def reshape_layout(ctx: Context, node, layout, in_shape, out_shape):
    """Layout of ``view(out_shape)`` of a tensor with ``layout``."""
    out = [[] for _ in out_shape]
    for gi, gj in _groups(in_shape, out_shape):
        if len(gi) == 1 and len(gj) == 1:
            out[gj[0]] = list(layout[gi[0]])
            continue
        dims = [layout[i] for i in gi]
        if any(isinstance(f, Dep) for d in dims for f in d):
            raise SplitConflict("reshape of a dependent axis")
        flat = [a for a in ctx.expand([f for d in dims for f in d]) if ctx.atoms.size[a] > 1]
        k = 0
        while k < len(gj):
            j = gj[k]
            need = out_shape[j]
            if (node.name, j) in ctx.indexed_sites and flat and ctx.atoms.size[flat[0]] > need:
                k = _dependent(ctx, node, flat.pop(0), gj, k, out_shape, out)
                continue
            taken, have = [], 1
            while have < need:
                a = flat.pop(0)
                size = ctx.atoms.size[a]
                if have * size > need:
                    part = need // have
                    flat[:0] = ctx._split_prod(
                        a, [part, size // part], (need % have) or size % part
                    )
                    continue
                taken.append(a)
                have *= size
            out[j] = taken
            if len(taken) == 1:
                ctx.site_of[taken[0]] = (node.name, j)
            k += 1
    return out


def _dependent(ctx: Context, node, atom, gj, k, out_shape, out) -> int:
    """Split ``atom`` as (index, rest...) where the index axis is later selected.

    The atom is cut into one segment per index value, each segment factored
    into the remaining output dims; those dims become :class:`Dep` axes.
    """
    j = gj[k]
    n = out_shape[j]
    rest_dims, rest = [], 1
    size = ctx.atoms.size[atom]
    for jj in gj[k + 1 :]:
        if rest == size // n:
            break
        rest_dims.append(jj)
        rest *= out_shape[jj]
    if rest * n != size or ctx.atoms.split_of(atom) is not None:
        raise SplitConflict("fused axis cannot be separated")
    segments = ctx.split_class(atom, "cat", [rest] * n)
    parts = []
    for seg in segments:
        sizes = [out_shape[jj] for jj in rest_dims]
        parts.append([seg] if len(sizes) == 1 else ctx.split_class(seg, "prod", sizes))
    key = ctx.new(n)
    out[j] = [key]
    for m, jj in enumerate(rest_dims):
        out[jj] = [Dep(key, tuple((p[m],) for p in parts))]
    return k + 1 + len(rest_dims)


def view(ctx: Context, node) -> None:
    """View / reshape / flatten / unflatten / squeeze / unsqueeze."""
    src = node.args[0]
    try:
        ctx.layouts[node.name] = reshape_layout(
            ctx, node, ctx.layouts[src.name], shape(src), shape(node)
        )
    except SplitConflict as err:
        ctx.block(ctx.layouts[src.name], f"reshape {node.name}: {err}")
        ctx.layouts[node.name] = ctx.fresh(shape(node), f"reshape {node.name}: {err}")


def transpose(ctx: Context, node) -> None:
    """transpose(x, d0, d1) and t(x)."""
    lay = list(ctx.layouts[node.args[0].name])
    if len(node.args) >= 3:
        d0, d1 = (norm_dim(d, len(lay)) for d in node.args[1:3])
    else:
        d0, d1 = 0, len(lay) - 1
    lay[d0], lay[d1] = lay[d1], lay[d0]
    ctx.layouts[node.name] = lay


def permute(ctx: Context, node) -> None:
    lay = ctx.layouts[node.args[0].name]
    ctx.layouts[node.name] = [lay[norm_dim(d, len(lay))] for d in node.args[1]]


def numpy_t(ctx: Context, node) -> None:
    """``x.T``: all axes reversed."""
    ctx.layouts[node.name] = list(reversed(ctx.layouts[node.args[0].name]))


def matrix_t(ctx: Context, node) -> None:
    """``x.mT``: the last two axes swapped."""
    lay = list(ctx.layouts[node.args[0].name])
    lay[-2], lay[-1] = lay[-1], lay[-2]
    ctx.layouts[node.name] = lay


def expand(ctx: Context, node) -> None:
    """expand: broadcast axes get fresh atoms along which the values are copies.

    Nothing can rescale or mix copies (their exponents are zero and GL is broken),
    but permuting them is harmless, so they still couple by permutation.
    """
    src = node.args[0]
    lay, in_shape, out_shape = ctx.layouts[src.name], shape(src), shape(node)
    offset = len(out_shape) - len(in_shape)
    out = ctx.fresh(out_shape)
    for i, dim in enumerate(out):
        j = i - offset
        if j >= 0 and in_shape[j] == out_shape[i]:
            out[i] = list(lay[j])
        elif out_shape[i] > 1:
            ctx.mark(dim, *NONLINEAR)
            for system in ("scale", "sign"):
                ctx.relate(system, [dim], (1,))
    ctx.layouts[node.name] = out


def repeat(ctx: Context, node) -> None:
    """repeat: axes repeated from size 1 are broadcast copies (as :func:`expand`).

    An axis of more than one unit repeated more than once holds tiles of the same
    units, which no layout here describes: it is blocked.
    """
    src = node.args[0]
    expand(ctx, node)
    for j, i in tiled_axes(node):  # tiles: neither the units nor the copies move
        ctx.block_dim(ctx.layouts[src.name][j], "repeat tiles an axis")
        ctx.block_dim(ctx.layouts[node.name][i], "repeat tiles an axis")


def tiled_axes(node) -> list[tuple[int, int]]:
    """``(input axis, output axis)`` pairs that a ``repeat`` node tiles (more than one unit)."""
    in_shape, reps = shape(node.args[0]), list(node.args[1])
    offset = len(reps) - len(in_shape)
    return [(j, offset + j) for j, n in enumerate(in_shape) if n > 1 and reps[offset + j] > 1]


def pad(ctx: Context, node) -> None:
    """pad(x, pads, mode, value): the trailing ``len(pads) / 2`` axes grow; the others pass.

    Padded axes are blocked. Along the others the values are copied (zeros, or
    reflected / replicated entries of the same unit), so units permute and, unless a
    nonzero constant is padded in, rescale with their inputs.
    """
    x, pads = node.args[0], node.args[1]
    if node.target._schema.name == "aten::constant_pad_nd":  # (x, pads, value)
        mode, value = "constant", arg(node, 2, "value", 0)
    else:
        mode, value = arg(node, 2, "mode", "constant"), arg(node, 3, "value", None)
    lay, out_shape = ctx.layouts[x.name], shape(node)
    n = len(lay) - len(pads) // 2
    out = ctx.fresh(out_shape)
    for i in range(n):
        out[i] = list(lay[i])
        if mode == "constant" and value not in (None, 0, 0.0) and out_shape[i] > 1:
            ctx.mark(out[i], *NONLINEAR)
            for system in ("scale", "sign"):
                ctx.relate(system, [out[i]], (1,))
    for i in range(n, len(lay)):
        ctx.block_dim(lay[i], "padded axis")
        ctx.block_dim(out[i], "padded axis")
    ctx.layouts[node.name] = out


def _take(ctx: Context, layout, dim: int, start: int, stop: int, keep: bool):
    """Layout of ``x[..., start:stop, ...]`` along ``dim`` (dropped if not ``keep``)."""
    lay = list(layout)
    d = lay[dim]
    if len(d) == 1 and not isinstance(d[0], Dep):
        key = ctx.atoms.root(d[0])
        deps = [
            (i, f)
            for i, dd in enumerate(lay)
            for f in dd
            if isinstance(f, Dep) and ctx.atoms.root(f.key) == key
        ]
        if deps and stop - start == 1:
            for i, f in deps:
                lay[i] = list(f.parts[start])
            if not keep:
                del lay[dim]
            return lay
        if deps:
            raise SplitConflict("slice of a fused axis")
        owner = ctx.owner.get(d[0])
        if d[0] in ctx.site_of and owner and (ctx.atoms.split_of(owner[0]) or ("",))[0] == "prod":
            ctx.hits.add(ctx.site_of[d[0]])
    seg = ctx.segment(d, start, stop)
    if keep:
        lay[dim] = seg
    else:
        del lay[dim]
    return lay


def _slicing(fn):
    def rule(ctx: Context, node) -> None:
        src = node.args[0]
        try:
            ctx.layouts[node.name] = fn(ctx, node, ctx.layouts[src.name], shape(src))
        except SplitConflict as err:
            ctx.block(ctx.layouts[src.name], f"{node.target} {node.name}: {err}")
            val = node.meta["val"]
            shapes = [tuple(v.shape) for v in val] if isinstance(val, list | tuple) else None
            ctx.layouts[node.name] = (
                [ctx.fresh(s, "slice") for s in shapes]
                if shapes
                else ctx.fresh(shape(node), "slice")
            )

    return rule


@_slicing
def select(ctx, node, lay, in_shape):
    dim = norm_dim(node.args[1], len(in_shape))
    idx = node.args[2] % in_shape[dim]
    return _take(ctx, lay, dim, idx, idx + 1, keep=False)


@_slicing
def unbind(ctx, node, lay, in_shape):
    dim = norm_dim(arg(node, 1, "dim", 0), len(in_shape))
    return [_take(ctx, lay, dim, i, i + 1, keep=False) for i in range(in_shape[dim])]


@_slicing
def slice_(ctx, node, lay, in_shape):
    dim = norm_dim(arg(node, 1, "dim", 0), len(in_shape))
    n = in_shape[dim]
    start, end, step = arg(node, 2, "start", 0), arg(node, 3, "end", None), arg(node, 4, "step", 1)
    start = 0 if start is None else (start + n if start < 0 else min(start, n))
    end = n if end is None else (end + n if end < 0 else min(end, n))
    if step != 1:
        raise SplitConflict("strided slice")
    return _take(ctx, lay, dim, start, end, keep=True)


@_slicing
def narrow(ctx, node, lay, in_shape):
    dim = norm_dim(node.args[1], len(in_shape))
    start = node.args[2] % in_shape[dim] if node.args[2] < 0 else node.args[2]
    return _take(ctx, lay, dim, start, start + node.args[3], keep=True)


@_slicing
def split(ctx, node, lay, in_shape):
    """Split / split_with_sizes / chunk."""
    dim = norm_dim(arg(node, 2, "dim", 0), len(in_shape))
    sizes = [tuple(v.shape)[dim] for v in node.meta["val"]]
    outs, start = [], 0
    for s in sizes:
        outs.append(_take(ctx, lay, dim, start, start + s, keep=True))
        start += s
    return outs


def index(ctx: Context, node) -> None:
    """index(x, [i0, i1, ...]): a gather along the indexed axes; the others are copied.

    The gathered axes (and the axes the index tensors give the output) carry
    nothing; every axis indexed by ``None`` keeps its values, so any linear map
    along it commutes with the gather (a relative-position table indexed along
    its rows keeps its head axis). Indexed axes must be adjacent.
    """
    x, indices = node.args[0], list(node.args[1])
    lx = ctx.layouts[x.name]
    used = [i for i, t in enumerate(indices) if t is not None]
    if not used or used != list(range(used[0], used[-1] + 1)):
        raise ValueError("non-adjacent advanced indices")
    for i in used:
        ctx.block_dim(lx[i], "gathered axis")
    before, after = lx[: used[0]], lx[used[-1] + 1 :]
    n_new = len(shape(node)) - len(before) - len(after)
    gathered = ctx.fresh(shape(node)[len(before) : len(before) + n_new], "gathered axis")
    out = ctx.like(before) + gathered + ctx.like(after)
    kept = out[: len(before)] + out[len(out) - len(after) :]
    for dx, do in zip(before + after, kept, strict=True):
        ctx.couple(do, dx)
    ctx.layouts[node.name] = out


def copy(ctx: Context, node) -> None:
    """copy(dst, src): the values (and so the axes) of ``src``, in the shape of ``dst``."""
    src = node.args[1]
    out_shape, src_shape = shape(node), shape(src)
    out = ctx.fresh(out_shape)
    offset = len(out_shape) - len(src_shape)
    for i, d in enumerate(ctx.layouts[src.name]):
        if src_shape[i] == out_shape[offset + i] and src_shape[i] > 1:
            out[offset + i] = list(d)
    ctx.layouts[node.name] = out


def getitem(ctx: Context, node) -> None:
    src, i = node.args
    ctx.layouts[node.name] = ctx.layouts[src.name][i]


def cat(ctx: Context, node) -> None:
    """cat(tensors, dim): the joined axis is a concatenation; the others are coupled."""
    tensors = [t for t in node.args[0] if is_tensor(t)]
    out_shape = shape(node)
    dim = norm_dim(arg(node, 1, "dim", 0), len(out_shape))
    out = ctx.fresh(out_shape)
    pieces = []
    for t in tensors:
        lay = ctx.layouts[t.name]
        if len(shape(t)) != len(out_shape):  # legacy empty tensors
            continue
        for i, d in enumerate(lay):
            if i != dim:
                ctx.couple(out[i], d)
        pieces.append(lay[dim])
    try:
        out[dim] = [ctx.concat(pieces)]
    except SplitConflict as err:
        out[dim] = ctx.fresh((out_shape[dim],), f"cat {node.name}: {err}")[0]
        for p in pieces:
            ctx.block_dim(p, f"cat {node.name}: {err}")
    ctx.layouts[node.name] = out


def stack(ctx: Context, node) -> None:
    tensors = node.args[0]
    out_shape = shape(node)
    dim = norm_dim(arg(node, 1, "dim", 0), len(out_shape))
    out = ctx.fresh(out_shape)
    for t in tensors:
        lay = ctx.layouts[t.name]
        for i, d in enumerate(lay):
            ctx.couple(out[i if i < dim else i + 1], d)
    out[dim] = [ctx.concat([[] for _ in tensors])]
    ctx.layouts[node.name] = out


def slice_scatter(ctx: Context, node) -> None:
    """slice_scatter(base, src, dim, start, end): ``src`` written into a slice of ``base``."""
    base, src = node.args[0], node.args[1]
    in_shape = shape(base)
    dim = norm_dim(arg(node, 2, "dim", 0), len(in_shape))
    n = in_shape[dim]
    start, end = arg(node, 3, "start", 0) or 0, arg(node, 4, "end", None)
    end = n if end is None else min(end + n if end < 0 else end, n)
    if arg(node, 5, "step", 1) != 1:
        constant(ctx, node)
        ctx.block(ctx.layouts[src.name], "strided slice_scatter")
        return
    base_lay, src_lay = ctx.layouts[base.name], ctx.layouts[src.name]
    out = ctx.fresh(shape(node))
    for i in range(len(in_shape)):
        if i != dim:
            ctx.couple(out[i], base_lay[i])
            ctx.couple(out[i], src_lay[i])
    try:
        before = ctx.segment(base_lay[dim], 0, start)
        after = ctx.segment(base_lay[dim], end, n)
        pieces = [
            p
            for p, size in ((before, start), (src_lay[dim], end - start), (after, n - end))
            if size
        ]
        out[dim] = [ctx.concat(pieces)]
    except SplitConflict as err:
        ctx.block_dim(src_lay[dim], f"slice_scatter: {err}")
        ctx.block_dim(base_lay[dim], f"slice_scatter: {err}")
    ctx.layouts[node.name] = out


IDENTITY = [
    "clone",
    "contiguous",
    "alias",
    "detach",
    "lift_fresh_copy",
    "lift_fresh",
    "_to_copy",
    "to",
    "type_as",
    "_assert_tensor_metadata",
    "positive",
]
CONSTANTS = [
    "zeros",
    "ones",
    "full",
    "arange",
    "empty",
    "new_zeros",
    "new_ones",
    "new_full",
    "new_empty",
    "zeros_like",
    "zero",
    "ones_like",
    "full_like",
    "empty_like",
    "scalar_tensor",
    "rand",
    "randn",
    "rand_like",
    "randn_like",
    "tril",
    "triu",
    "eye",
]
VIEWS = ["view", "reshape", "_unsafe_view", "flatten", "unflatten", "squeeze", "unsqueeze"]
VIEWS += ["reshape_as", "view_as"]  # the shape comes from the node, not the second operand

RULES = {f"aten::{n}": identity for n in IDENTITY}
RULES["aten::as_strided_"] = restride
RULES.update({f"aten::{n}": constant for n in CONSTANTS})
RULES.update({f"aten::{n}": view for n in VIEWS})
RULES.update(
    {
        "aten::dropout": dropout,
        "aten::feature_dropout": dropout,
        "aten::transpose": transpose,
        "aten::t": transpose,
        "aten::permute": permute,
        "aten::numpy_T": numpy_t,
        "aten::mT": matrix_t,
        "aten::expand": expand,
        "aten::expand_as": expand,
        "aten::repeat": repeat,
        "aten::pad": pad,
        "aten::constant_pad_nd": pad,
        "aten::select": select,
        "aten::unbind": unbind,
        "aten::slice": slice_,
        "aten::narrow": narrow,
        "aten::split": split,
        "aten::split_with_sizes": split,
        "aten::chunk": split,
        "aten::cat": cat,
        "aten::stack": stack,
        "aten::slice_scatter": slice_scatter,
        "aten::copy": copy,
        "aten::index": index,
        "_operator::getitem": getitem,
    }
)
