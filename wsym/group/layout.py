"""The one block reader: leaf-level blocks of a tensor, and a group's blocks as matrices.

A tensor's layout (one tree per axis, :mod:`wsym.group.spec`) cuts it into
*leaf-level blocks*: products of axes are viewed apart, concatenations split.
:func:`transform` visits them (the slow, obvious reference); :func:`block_plan`
finds them once per spec (one view, or one gather by flat indices) and
:func:`map_blocks` / :func:`blocks_of` use the plan.

A group's blocks as matrices (:func:`gather`): every block holding the group's
class axis exactly once, moved to ``(*index, rows, h)`` and concatenated along
the rows, per part:

* ``gl`` / ``orthogonal`` (``matrix`` kinds): part = the axis's parity (rows
  transforming as ``x M`` or ``x M^-T``), index = the group's index classes;
* ``scaling``-type (``diagonal`` kinds), as ``GL(1)`` blocks: part 0 the
  entries of exponent +1, part 1 those of exponent -1, shape ``(n, rows, 1)``
  (``(prod(index) * n, rows, 1)`` for a group with one copy per index value,
  index-major: one block per expert and unit).

:func:`scatter` is its exact inverse on the entries gathered and its adjoint:
``<gather(x), p> == <x, scatter(p)>``.

Shapes:
    ``gather``: ``{name: (*shape)}`` -> ``{part: (*index, rows, h)}``;
    ``scatter``: ``{part: (*index, rows, h)}`` -> ``{name: (*shape)}``.

Example:
    >>> import torch, wsym
    >>> from wsym.models.networks import MLP
    >>> model = MLP(4, [3], 2, "identity").double()
    >>> spec = wsym.detect(model, torch.randn(2, 4, dtype=torch.float64))
    >>> sd = model.state_dict()
    >>> parts = gather(spec, spec.groups[0], sd)
    >>> {k: tuple(v.shape) for k, v in parts.items()}
    {0: (5, 3), 1: (2, 3)}
    >>> back = scatter(spec, spec.groups[0], parts, sd)
    >>> all(torch.equal(back[k], sd[k]) for k in back)
    True
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch
from torch import Tensor

from wsym.group.memo import derived
from wsym.group.registry import kind_of
from wsym.group.spec import Group, Leaf, Split, SymmetrySpec, leaves


def transform(t: Tensor, trees: list, fn) -> Tensor:
    """Apply ``fn(block, leaves)`` to every leaf-level block of ``t`` (one tree per axis).

    A relabeled axis (:class:`~wsym.group.spec.Leaf`, :class:`~wsym.group.spec.Split`)
    reaches ``fn`` in its classes' order and goes back in the tensor's.
    """
    for i, tree in enumerate(trees):
        if _relabel(tree):  # position k holds unit r[k]: unit u sits at argsort(r)[u]
            inner = dataclasses.replace(tree, relabel=())
            t = t.index_select(i, _positions(tree.relabel))
            out = transform(t, trees[:i] + [inner] + trees[i + 1 :], fn)
            return out.index_select(i, _units(tree.relabel))
        if isinstance(tree, Split) and tree.mode == "prod":
            sizes = tuple(c.size for c in tree.children)
            new = t.reshape(t.shape[:i] + sizes + t.shape[i + 1 :])
            out = transform(new, trees[:i] + list(tree.children) + trees[i + 1 :], fn)
            return out.reshape(t.shape)
        if isinstance(tree, Split):
            parts = torch.split(t, [c.size for c in tree.children], dim=i)
            return torch.cat(
                [
                    transform(p, trees[:i] + [c] + trees[i + 1 :], fn)
                    for p, c in zip(parts, tree.children, strict=True)
                ],
                dim=i,
            )
    return fn(t, trees)


def _relabel(tree) -> tuple:
    return getattr(tree, "relabel", ())


@functools.lru_cache(maxsize=256)
def _units(relabel: tuple) -> Tensor:
    """Per position, the unit it holds."""
    return torch.tensor(relabel, dtype=torch.long)


@functools.lru_cache(maxsize=256)
def _positions(relabel: tuple) -> Tensor:
    """Per unit, the position holding it."""
    return torch.argsort(_units(relabel))


def relabeled(spec: SymmetrySpec, key: str | None = None) -> bool:
    """Whether a leaf of ``key``'s layout (of any, without ``key``) is relabeled."""

    def compute(dims):
        return any(_relabel(n) for t in dims for n in _nodes(t))

    if key is None:
        return derived(spec, "relabeled", lambda: any(compute(d) for _, d in spec.layouts))
    return derived(spec, ("relabeled", key), lambda: compute(spec.layout[key]))


def refuse_relabeled(spec: SymmetrySpec, who: str) -> None:
    """One-line :class:`~wsym.errors.WsymInputError` for a consumer that reads axes itself."""
    if relabeled(spec):
        from wsym.errors import WsymInputError

        raise WsymInputError(
            f"{who} reads tensor axes in their stored order, and this spec relabels a class "
            "along some axis (a channel shuffle); drop those groups from the spec "
            "(or detect on the model without the shuffle)"
        )


def block_plan(spec: SymmetrySpec, key: str) -> tuple | list:
    """How to reach the leaf-level blocks of ``key`` (those :func:`transform` visits), memoized.

    ``(shape, leaves)`` when no axis is a concatenation (one view), else
    ``[(flat index tensor of the block, leaves)]`` in :func:`transform`'s order.
    """
    return derived(spec, ("blocks", key), lambda: _plan(spec.layout[key]))


def _plan(trees) -> tuple | list:
    nodes = [t for tree in trees for t in _nodes(tree)]
    if not any((isinstance(t, Split) and t.mode == "cat") or _relabel(t) for t in nodes):
        lv = [leaf for tree in trees for leaf in leaves(tree)]
        return tuple(leaf.size for leaf in lv), lv
    numbers = torch.arange(math.prod(t.size for t in trees)).reshape(tuple(t.size for t in trees))
    return [(idx.clone(), lv) for idx, lv in _grab_blocks(numbers, trees)]


def _nodes(tree) -> list:
    """A layout tree's nodes, the tree first."""
    return [tree] + (
        [n for c in tree.children for n in _nodes(c)] if isinstance(tree, Split) else []
    )


def _grab_blocks(t: Tensor, trees) -> list:
    out = []
    transform(t, list(trees), lambda block, lv: out.append((block, list(lv))) or block)
    return out


def plan_leaves(plan) -> list[list[Leaf]]:
    """The leaves of each block of a :func:`block_plan`, in its order."""
    return [list(plan[1])] if isinstance(plan, tuple) else [list(lv) for _, lv in plan]


def blocks_of(spec: SymmetrySpec, key: str, t: Tensor) -> list[tuple[Tensor, list[Leaf]]]:
    """``[(block, leaves)]``: the leaf-level blocks of ``t = state_dict[key]`` (read only)."""
    plan = block_plan(spec, key)
    if isinstance(plan, tuple):
        return [(t.reshape(plan[0]), list(plan[1]))]
    flat = t.reshape(-1)
    return [(flat[idx], lv) for idx, lv in plan]


def block_at(spec: SymmetrySpec, key: str, t: Tensor, b: int) -> tuple[Tensor, list[Leaf]]:
    """Block number ``b`` of :func:`blocks_of` (only that one is read).

    A view of ``t`` (to read, not to write) unless the block is relabeled, when it
    is gathered by the plan's flat indices.
    """
    plan = block_plan(spec, key)
    if isinstance(plan, tuple):
        return t.reshape(plan[0]), list(plan[1])
    idx, lv = plan[b]
    if relabeled(spec, key):
        return t.reshape(-1)[idx], lv
    return _at(t.contiguous(), _boxes(spec, key)[b]), lv


def map_blocks(spec: SymmetrySpec, key: str, t: Tensor, fn, cls=None, zero=False) -> Tensor:
    """:func:`transform` of ``t = state_dict[key]`` along the spec's layout, from its plan.

    With ``cls`` (a class, or a frozenset of classes), ``fn`` is only called on the
    blocks with a leaf of that class
    (``fn`` must leave the others unchanged, or, with ``zero``, map them to zero):
    a tensor concatenated from many classes (a DenseNet's BatchNorm over all
    earlier layers' features) is then visited once per group, not once per block.
    The blocks of a concatenation are read and written as views (:func:`_boxes`);
    a relabeled one (in its class's order) by its plan's flat indices.
    """
    plan = block_plan(spec, key)
    if isinstance(plan, tuple):
        shape, lv = plan
        return fn(t.reshape(shape), list(lv)).reshape(t.shape)
    if cls is None:
        visit = range(len(plan))
    elif isinstance(cls, frozenset):  # any of several classes
        visit = sorted({b for c in cls for b in blocks_with(spec, key, c)})
    else:
        visit = blocks_with(spec, key, cls)
    if relabeled(spec, key):
        return _map_indexed(plan, visit, t, fn, zero)
    boxes = _boxes(spec, key)
    src = t.contiguous()
    done = [(boxes[b], fn(_at(src, boxes[b]), plan[b][1])) for b in visit]
    dtype = done[0][1].dtype if done else t.dtype
    if len(done) == len(plan):
        out = torch.empty(t.shape, dtype=dtype)
    else:
        out = torch.zeros(t.shape, dtype=dtype) if zero else t.to(dtype, copy=True)
    for steps, block in done:
        view = _at(out, steps)
        view.copy_(block.reshape(view.shape))
    return out


def _map_indexed(plan: list, visit, t: Tensor, fn, zero: bool) -> Tensor:
    """:func:`map_blocks` by gathering and scattering the plan's flat indices."""
    flat = t.reshape(-1)
    done = [(plan[b][0], fn(flat[plan[b][0]], list(plan[b][1]))) for b in visit]
    dtype = done[0][1].dtype if done else t.dtype
    out = torch.zeros(flat.shape, dtype=dtype) if zero else flat.to(dtype, copy=True)
    for idx, block in done:
        out[idx.reshape(-1)] = block.reshape(-1)
    return out.reshape(t.shape)


def _boxes(spec: SymmetrySpec, key: str) -> list[tuple]:
    """The blocks of :func:`block_plan` as views: per block, the ``steps`` that reach it.

    ``("view", shape)`` splits a product axis, ``("narrow", axis, start, length)``
    cuts a concatenation; in :func:`transform`'s order (the plan's), memoized.
    """

    def compute():
        out: list = []

        def walk(shape, trees, steps):
            for i, tree in enumerate(trees):
                if isinstance(tree, Split) and tree.mode == "prod":
                    new = shape[:i] + tuple(c.size for c in tree.children) + shape[i + 1 :]
                    trees = trees[:i] + list(tree.children) + trees[i + 1 :]
                    return walk(new, trees, (*steps, ("view", new)))
                if isinstance(tree, Split):
                    start = 0
                    for child in tree.children:
                        sub = shape[:i] + (child.size,) + shape[i + 1 :]
                        step = ("narrow", i, start, child.size)
                        walk(sub, trees[:i] + [child] + trees[i + 1 :], (*steps, step))
                        start += child.size
                    return None
            out.append(steps)
            return None

        trees = list(spec.layout[key])
        walk(tuple(t.size for t in trees), trees, ())
        return out

    return derived(spec, ("boxes", key), compute)


def _at(t: Tensor, steps) -> Tensor:
    """The view of ``t`` that ``steps`` (from :func:`_boxes`) reach."""
    for step in steps:
        t = t.view(step[1]) if step[0] == "view" else t.narrow(*step[1:])
    return t


def blocks_with(spec: SymmetrySpec, key: str, cls: int) -> tuple[int, ...]:
    """Numbers of the blocks of ``key``'s :func:`block_plan` with a leaf of class ``cls``."""

    def compute():
        out: dict = {}
        for b, lv in enumerate(plan_leaves(block_plan(spec, key))):
            for c in {leaf.cls for leaf in lv}:
                out.setdefault(c, []).append(b)
        return {c: tuple(v) for c, v in out.items()}

    return derived(spec, ("blocks_with", key), compute).get(cls, ())


def class_params(spec: SymmetrySpec, cls: int, with_buffers: bool = False) -> list[str]:
    """State-dict keys with an axis in class ``cls`` (parameters only by default)."""

    def compute():  # one pass over the layouts for every class
        skip = set() if with_buffers else set(spec.buffers)
        out: dict[int, list[str]] = {}
        for p, dims in spec.layouts:
            if p not in skip:
                for c in dict.fromkeys(leaf.cls for t in dims for leaf in leaves(t)):
                    out.setdefault(c, []).append(p)
        return {c: tuple(ps) for c, ps in out.items()}

    return list(derived(spec, ("class_params", with_buffers), compute).get(cls, ()))


def _slots(spec: SymmetrySpec, group: Group) -> tuple:
    """``((param, block number, part, source axes), ...)``: where :func:`gather` reads."""
    diagonal = kind_of(group).diagonal
    exps = dict(group.exponents)
    out = []
    for p in class_params(spec, group.cls):
        for b, lv in enumerate(plan_leaves(block_plan(spec, p))):
            axes = [i for i, leaf in enumerate(lv) if leaf.cls == group.cls]
            if len(axes) != 1:
                continue
            idx = [next(i for i, leaf in enumerate(lv) if leaf.cls == c) for c in group.index]
            if diagonal:
                e = exps.get(lv[axes[0]].var, 0)
                if e in (1, -1):
                    out.append((p, b, 0 if e == 1 else 1, (*idx, axes[0])))
                continue
            out.append((p, b, lv[axes[0]].parity, (*idx, axes[0])))
    return tuple(out)


def _moved(block: Tensor, src: tuple, diagonal: bool, h: int) -> Tensor:
    if diagonal:  # one GL(1) block per unit (and per index value: per expert)
        moved = block.movedim(list(src), list(range(len(src))))
        return moved.reshape(math.prod(moved.shape[: len(src)]), -1, 1)
    dst = [*range(len(src) - 1), block.ndim - 1]
    moved = block.movedim(list(src), dst)
    return moved.reshape(*moved.shape[: len(src) - 1], -1, h)


def gather(spec: SymmetrySpec, group: Group, tensors: dict) -> dict[int, Tensor]:
    """``{part: (*index, rows, h)}``: ``group``'s blocks in ``tensors`` (see the module doc).

    Parameters absent from ``tensors`` are skipped; buffers are never read.
    """
    diagonal = kind_of(group).diagonal
    parts: dict[int, list] = {0: [], 1: []}
    for p, b, part, src in derived(spec, ("slots", group), lambda: _slots(spec, group)):
        if p in tensors:
            block = block_at(spec, p, tensors[p], b)[0]
            parts[part].append(_moved(block, src, diagonal, group.size))
    return {k: torch.cat(v, dim=-2) for k, v in parts.items() if v}


def scatter(spec: SymmetrySpec, group: Group, parts: dict, like: dict) -> dict[str, Tensor]:
    """Tensors shaped like ``like``'s (those ``group`` reads) holding ``parts``, zero elsewhere.

    The inverse of :func:`gather` on the entries it reads, and its adjoint.
    """
    diagonal = kind_of(group).diagonal
    dtype = next(iter(parts.values())).dtype
    flat = {p: torch.zeros(like[p].numel(), dtype=dtype) for p in class_params(spec, group.cls)}
    flat = {p: v for p, v in flat.items() if p in like}
    offset = {0: 0, 1: 0}
    for p, b, part, src in derived(spec, ("slots", group), lambda: _slots(spec, group)):
        if p not in like:
            continue
        plan = block_plan(spec, p)
        shape = plan[0] if isinstance(plan, tuple) else tuple(x.size for x in plan[b][1])
        numbers = torch.arange(math.prod(shape)).reshape(shape)
        where = _moved(numbers, src, diagonal, group.size)
        rows = where.shape[-2]
        start = offset[part]
        offset[part] = start + rows
        values = parts[part][..., start : start + rows, :]
        target = where if isinstance(plan, tuple) else plan[b][0].reshape(-1)[where]
        flat[p][target.reshape(-1)] = values.reshape(-1).to(dtype)
    return {p: v.reshape(like[p].shape) for p, v in flat.items()}
