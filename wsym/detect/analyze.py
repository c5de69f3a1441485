"""Walk a traced graph, applying one rule per node, into a :class:`Context`."""

from __future__ import annotations

import operator

import torch

from wsym.detect.atoms import SplitConflict
from wsym.detect.context import Context
from wsym.detect.relabel import block_unsound, resolve
from wsym.detect.rules import MASKS, RULES
from wsym.detect.rules.rotary import find_rotary, parameter_free, rotary
from wsym.detect.rules.shape import tiled_axes
from wsym.detect.tracing.export import Traced

MAX_PASSES = 4


def rule_name(node: torch.fx.Node) -> str:
    """Schema name of a call node (``"aten::linear"``), overloads merged."""
    if node.target is operator.getitem:
        return "_operator::getitem"
    schema = getattr(node.target, "_schema", None)
    return schema.name if schema is not None else str(node.target)


def _is_float(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return hasattr(val, "dtype") and val.dtype.is_floating_point


def _fresh_like(ctx: Context, node, reason: str):
    val = node.meta.get("val")
    if isinstance(val, list | tuple):
        return tuple(ctx.fresh(tuple(v.shape), reason) if hasattr(v, "shape") else [] for v in val)
    if hasattr(val, "shape"):
        return ctx.fresh(tuple(val.shape), reason)
    return []


def _tensor_layouts(ctx: Context, node) -> list:
    lay = ctx.layouts.get(node.name)
    if lay is None:
        return []
    val = node.meta.get("val")
    return list(lay) if isinstance(val, list | tuple) else [lay]


def live_nodes(graph: torch.fx.Graph) -> set[str]:
    """Names of the nodes the outputs depend on.

    The rest is dead code for the function being analysed: parameters of
    branches that only run in training mode (GoogLeNet's and Inception's
    auxiliary classifiers in eval mode), values computed and dropped. Their
    parameters carry no group: any transformation of them trivially "holds".
    """
    live: set[str] = set()
    for node in reversed(graph.nodes):
        if node.op == "output" or node.name in live:
            live.add(node.name)
            live.update(s.name for s in node.all_input_nodes)
    return live


def run_pass(traced: Traced, indexed_sites=frozenset(), ties=(), factored=frozenset()) -> Context:
    """One pass of all rules over the graph; ``ties`` are placeholder pairs sharing storage.

    ``factored``: the channel shuffles read as their ``(g, C/g)`` factors
    (:mod:`wsym.detect.relabel`).
    """
    ctx = Context(indexed_sites=frozenset(indexed_sites), factored=frozenset(factored))
    tied = dict(ties)
    free = parameter_free(traced.graph, set(traced.parameters))
    rotaries, inside = find_rotary(traced.graph, free)
    live = live_nodes(traced.graph)
    for node in traced.graph.nodes:
        if node.op == "call_function" and node.name not in live:
            continue  # dead code: nothing it couples matters
        ctx.op = f"{rule_name(node)} ({node.name})" if node.op == "call_function" else ""
        if node.name in inside:
            continue  # part of a rotary embedding, handled at its final add
        if node.name in rotaries:
            rotary(ctx, node, rotaries[node.name])
            continue
        if node.op == "placeholder":
            if node.name in traced.parameters or node.name in traced.buffers:
                reason = None if _is_float(node) else "integer parameter or buffer"
                ctx.layouts[node.name] = (
                    _fresh_like(ctx, node, reason) if reason else _fresh_like_free(ctx, node)
                )
            else:
                ctx.layouts[node.name] = _fresh_like(ctx, node, "model input")
            if node.name in tied:  # tied weights move together
                for da, db in zip(
                    ctx.layouts[node.name], ctx.layouts[tied[node.name]], strict=True
                ):
                    ctx.couple(da, db)
        elif node.op == "get_attr":
            ctx.layouts[node.name] = _fresh_like(ctx, node, "constant tensor")
        elif node.op == "call_function":
            _apply(ctx, node, quiet=node.name in free)
        elif node.op == "output":
            for src in node.all_input_nodes:
                for lay in _tensor_layouts(ctx, src):
                    ctx.block(lay, "model output")
    ctx.op = ""
    for name in traced.buffers:
        if name not in ctx.allowed_buffers:
            for lay in _tensor_layouts(ctx, _node(traced, name)):
                ctx.block(lay, "buffer")
    return ctx


def _fresh_like_free(ctx: Context, node):
    return ctx.fresh(tuple(node.meta["val"].shape))


def _node(traced: Traced, name: str):
    return next(n for n in traced.graph.nodes if n.name == name)


def _apply(ctx: Context, node, quiet: bool = False) -> None:
    """Run the node's rule; an unknown op blocks its operands.

    ``quiet``: no warning, for computations that do not involve the parameters
    (position tables, masks).
    """
    name = rule_name(node)
    rule = RULES.get(name)
    if rule is None and name.endswith("_") and not _writes_into_input(node):
        rule = RULES.get(name[:-1])  # relu_(x) read as relu(x); see graph.trace
    if rule is None or not (_is_float_op(node) or name in MASKS):
        reason = f"operation {name} is not understood" if rule is None else f"integer op {name}"
        if rule is None and not quiet and any(_is_float(s) for s in node.all_input_nodes):
            ctx.warn(f"{name} ({node.name}) is not understood; it blocks symmetries through it")
        for src in node.all_input_nodes:
            for lay in _tensor_layouts(ctx, src):
                ctx.block(lay, reason)
        ctx.layouts[node.name] = _fresh_like(ctx, node, reason)
        return
    try:
        rule(ctx, node)
        if isinstance(node.meta.get("val"), list | tuple):
            ctx.layouts[node.name] = tuple(ctx.layouts[node.name])
    except (SplitConflict, AttributeError, KeyError, IndexError, ValueError, TypeError) as err:
        reason = f"{name} ({node.name}) could not be analysed: {err}"
        ctx.warn(reason)
        for src in node.all_input_nodes:
            for lay in _tensor_layouts(ctx, src):
                ctx.block(lay, reason)
        ctx.layouts[node.name] = _fresh_like(ctx, node, reason)


# public ops without a rule that torch.export keeps as they are (no decomposition of
# an op a rule reads): a recording holding them is read as the export would be
KEPT_BY_EXPORT = frozenset(
    f"aten::{n}"
    for n in (
        "upsample_nearest2d upsample_bilinear2d upsample_bicubic2d roll addcmul baddbmm "
        "masked_fill cumsum histc topk sort swapaxes eq fill"
    ).split()
)


def unknown_ops(traced: Traced) -> list[str]:
    """Names of the ops without a rule that the outputs read and the parameters reach.

    Ops of :data:`KEPT_BY_EXPORT` are left out: an export would not read them either;
    so are integer ops (indices, sorting, counting): :func:`_apply` reads any of them
    the same way, rule or not, so an export could not read them better (HF Mixtral's
    expert dispatch writes an inverse permutation with ``index_put_``).
    """
    free = parameter_free(traced.graph, set(traced.parameters))
    live = live_nodes(traced.graph)
    out = []
    for node in traced.graph.nodes:
        if node.op != "call_function" or node.name in free or node.name not in live:
            continue
        name = rule_name(node)
        if not (_is_float_op(node) or name in MASKS):
            continue
        known = name in RULES or (name.endswith("_") and name[:-1] in RULES)
        if name == "aten::repeat" and tiled_axes(node):  # InstanceNorm's decomposition:
            known = False  # the export keeps instance_norm, which a rule reads
        if not known and name not in KEPT_BY_EXPORT:
            out.append(name)
    return out


def _writes_into_input(node) -> bool:
    target = node.args[0] if node.args else None
    return not isinstance(target, torch.fx.Node) or target.op != "call_function"


def _is_float_op(node) -> bool:
    """Ops whose (first) output is floating point (integer/bool ops carry indices, masks).

    Of an op with several outputs only the first decides: ``max_pool2d_with_indices``
    computes its values in floating point, the indices are a by-product its rule reads.
    """
    val = node.meta.get("val")
    vals = [v for v in (val if isinstance(val, list | tuple) else [val]) if v is not None]
    return bool(vals) and hasattr(vals[0], "dtype") and vals[0].dtype.is_floating_point


def analyze(traced: Traced, ties=()) -> Context:
    """Run passes until no fused axis remains to be separated and every shuffle's merge holds.

    A shuffle whose merge does not hold is read as its factors in the next pass;
    after the last, both sides of any still left are blocked.
    """
    sites: set = set()
    factored: set = set()
    for _ in range(MAX_PASSES):
        ctx = run_pass(traced, sites, ties, factored)
        ctx.merged, unsound = resolve(ctx)
        if ctx.hits <= sites and not unsound:
            return ctx
        sites |= ctx.hits
        factored |= unsound
    block_unsound(ctx, unsound)
    return ctx
