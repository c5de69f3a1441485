"""The fused action: many groups' parts applied to a state in one pass per tensor.

A group element is a sequence of parts (one per group); each kind turns its part into
per-block functions (:meth:`~wsym.group.kinds.base.Kind.chain_parts`). :func:`act_chain`
runs all the parts on a tensor in one pass, and where every part reorders or multiplies
each class axis on its own (:attr:`~wsym.group.kinds.base.Kind.axis_map`), finds each
axis's reordering and factors once, on vectors, and applies them with one
``index_select`` and one product per axis.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from wsym.group.kinds.base import along
from wsym.group.layout import map_blocks, transform
from wsym.group.memo import derived
from wsym.group.registry import kind_of
from wsym.group.spec import Split, SymmetrySpec, leaves


def act_chain(spec: SymmetrySpec, parts: list, state: dict) -> None:
    """``parts = [(group, value), ...]`` of :attr:`Kind.fusable` kinds, acting in turn on ``state``.

    ``state``'s entries are replaced one tensor at a time, so that no second copy
    of every tensor it moves is held at once.

    Each tensor is split into blocks once, not once per group: a DenseNet's
    features are read by every later layer, so each of its ~2500 groups touches
    ~40 tensors. Where every part on a tensor acts on each class axis on its own,
    reordering or multiplying it (:attr:`Kind.axis_map`), the parts' effect on one
    axis is found once on vectors along it (``arange`` and ones, through the same
    :meth:`Kind.block_fn` calls, in order) and applied with one ``index_select``
    and one product per axis: the per-block calls then touch vectors, not the
    weights. Reorderings are exact; products agree with block by block to round-off.
    """
    fns: dict = {}
    for group, value in parts:  # every part's chain read off the state before any acts
        for keys, part in kind_of(group).chain_parts(spec, group, value, state):
            for key in keys:
                fns.setdefault(key, []).append(part)

    maps: dict = {}  # (leaf class, parts on it) -> its reordering and factors
    for key, fs in fns.items():
        if all(mode for _, _, mode, _ in fs):
            state[key] = _by_axis(spec, key, state[key], fs, maps)
        else:
            chain = _chain([(c, f) for c, f, *_ in fs])
            state[key] = map_blocks(spec, key, state[key], chain, frozenset(c for c, *_ in fs))


def _chain(fs):
    """One ``fn(block, leaves)`` applying ``fs = [(class, fn)]`` in turn where the class is."""

    def fn(t, lv):
        here = {leaf.cls for leaf in lv}
        for cls, f in fs:
            if cls in here:
                t = f(t, lv)
        return t

    return fn


def _paired(fs):
    """:func:`_chain` on an axis's ``(index, factor)`` pairs (a trailing axis of 2).

    Reorderings move both; products multiply the factors only.
    """

    def fn(t, lv):
        here = {leaf.cls for leaf in lv}
        for cls, f, mode, _ in fs:
            if cls in here:
                if mode == "index":
                    t = f(t, lv)
                else:
                    t = torch.stack((t[..., 0], f(t[..., 1], lv)), dim=-1)
        return t

    return fn


def _by_axis(spec: SymmetrySpec, key: str, t: Tensor, fs, maps: dict) -> Tensor:
    """``t = state[key]`` acted on by ``fs`` one axis at a time (:func:`act_chain`).

    Along each axis the parts compose to ``x[i] -> x[index[i]] * factor[i]``, found
    on ``(arange, ones)`` and applied as one ``index_select`` and one product
    (in place, once ``t`` is a new tensor: the caller's is never written).
    An axis that is a concatenation of leaves (:func:`_axis_leaves`) gets its map
    from its leaves' (:func:`_leaf_map`), joined with one ``cat``; any other goes
    through :func:`transform` on ``(arange, ones)``.
    """
    by_cls: dict = {}
    for k, (c, *_) in enumerate(fs):
        by_cls.setdefault(c, []).append(k)
    trees = spec.layout[key]
    flat = derived(spec, ("axis_leaves", key), lambda: tuple(_axis_leaves(x) for x in trees))
    steps = []
    for ax, tree in enumerate(trees):
        if flat[ax] is None:
            on = _parts_on(tree, by_cls)
            if not on:
                continue
            index, factor = _tree_map(tree, [fs[k] for k in on])
            modes = {fs[k][2] for k in on}
        else:
            index, factor, modes = _joined_map(flat[ax], fs, by_cls, maps)
            if not modes:
                continue
        steps.append(
            (ax, index if "index" in modes else None, factor if "factor" in modes else None)
        )
    return _apply_steps(t, steps, maps)


def _apply_steps(t: Tensor, steps: list, maps: dict) -> Tensor:
    """``t`` reordered and multiplied along each axis of ``steps`` (``(axis, index, factor)``).

    The first of several reorderings is written into one scratch buffer shared by the
    whole :func:`act_chain` (the next one reads it at once, into a new tensor): a
    weight reordered along two axes then takes one new tensor, not two (each new
    tensor costs page faults, together a forward pass's worth on a DenseNet).
    """
    own = False
    reorders = [k for k, (_, index, _) in enumerate(steps) if index is not None]
    for k, (ax, index, factor) in enumerate(steps):
        if index is not None and k == reorders[0] and len(reorders) > 1:  # read at once
            shape = t.shape[:ax] + (index.numel(),) + t.shape[ax + 1 :]
            t = select(t, ax, index, out=_scratch(maps, shape, t.dtype))
            own = True
        elif index is not None:
            t, own = select(t, ax, index), True
        if factor is not None:
            f = along(factor.to(t.dtype), ax, t.ndim)
            t, own = (t.mul_(f) if own else t * f), True
    return t


def select(t: Tensor, ax: int, index: Tensor, out: Tensor | None = None) -> Tensor:
    """``t.index_select(ax, index)`` (into ``out`` if given), by NumPy's ``take`` past axis 0.

    PyTorch's CPU kernel gathers along a later axis element by element; NumPy's
    copies runs of the trailing axes: on a 2016 x 2016 weight reordered along its
    inputs, 9.7 ms instead of 37 ms (a RegNet's whole state: ~40% of acting). Tensors
    that autograd tracks, and other devices and dtypes, take PyTorch's kernel.
    """
    if ax == 0 or t.requires_grad or t.device.type != "cpu" or t.dtype not in _NUMPY:
        return (
            t.index_select(ax, index) if out is None else torch.index_select(t, ax, index, out=out)
        )
    # "wrap": the indices are in range, and the default ("raise") buffers ``out``
    taken = np.take(
        t.numpy(), index.numpy(), axis=ax, mode="wrap", out=None if out is None else out.numpy()
    )
    return out if out is not None else torch.from_numpy(taken)


_NUMPY = (torch.float64, torch.float32)


def _scratch(maps: dict, shape, dtype) -> Tensor:
    """A buffer of ``shape`` from ``maps``' scratch (grown as needed, overwritten each time)."""
    n = math.prod(shape)
    buf = maps.get(("scratch", dtype))
    if buf is None or buf.numel() < n:
        buf = maps["scratch", dtype] = torch.empty(n, dtype=dtype)
    return buf[:n].view(shape)


def _axis_leaves(tree) -> tuple | None:
    """``(leaves, offsets)`` of an axis that is a concatenation of leaves, else None.

    One-child products are looked through; a product of several sub-axes or a
    relabeled concatenation is not such an axis (a relabeled leaf is).
    """
    out: list = []

    def walk(node, start) -> bool:
        if isinstance(node, Split):
            if node.relabel or (node.mode == "prod" and len(node.children) != 1):
                return False
            for child in node.children:
                if not walk(child, start):
                    return False
                start += child.size
            return True
        out.append((node, start))
        return True

    if not walk(tree, 0):
        return None
    offsets = torch.tensor([off for _, off in out], dtype=torch.long)
    sizes = torch.tensor([leaf.size for leaf, _ in out], dtype=torch.long)
    return tuple(leaf for leaf, _ in out), torch.repeat_interleave(offsets, sizes)


def _joined_map(flat, fs, by_cls: dict, maps: dict) -> tuple[Tensor, Tensor, set]:
    """``(index, factor, modes)`` of a concatenation of leaves: each leaf's map, joined."""
    lv, offsets = flat
    indices, factors, modes = [], [], set()
    for leaf in lv:
        on = by_cls.get(leaf.cls)
        if on is None:
            index, factor = _identity(leaf.size, maps)
        else:
            signature = tuple((id(fs[k][1]), fs[k][3](leaf)) for k in on)
            memo = (leaf.cls, leaf.size, leaf.relabel, signature)
            if memo not in maps:
                maps[memo] = _leaf_map(leaf, [fs[k] for k in on], maps)
            index, factor = maps[memo]
            modes.update(fs[k][2] for k in on)
        indices.append(index)
        factors.append(factor)
    if len(lv) == 1:
        return indices[0], factors[0], modes
    return torch.cat(indices) + offsets, torch.cat(factors), modes


def _identity(n: int, maps: dict) -> tuple[Tensor, Tensor]:
    if ("identity", n) not in maps:
        maps["identity", n] = torch.arange(n), torch.ones(n, dtype=torch.float64)
    return maps["identity", n]


def _leaf_map(leaf, parts, maps: dict) -> tuple[Tensor, Tensor]:
    """``(index, factor)`` of ``parts`` along one leaf, from their :meth:`Kind.block_fn` calls.

    On ``arange`` and ones, in order: reorderings move both, products multiply the
    factors (the values :func:`_paired` finds through :func:`transform`).
    """
    if leaf.relabel:  # read in the class's order, as transform hands it over
        return _tree_map(leaf, parts)
    index, factor = _identity(leaf.size, maps)  # never written: the calls return new tensors
    lv = [leaf]
    for _, f, mode, _ in parts:
        if mode == "index":
            index = f(index, lv)
        factor = f(factor, lv)
    return index, factor


def _tree_map(tree, parts) -> tuple[Tensor, Tensor]:
    """``(index, factor)`` of ``parts`` along one axis, through :func:`transform`."""
    pair = torch.stack(
        (
            torch.arange(tree.size, dtype=torch.float64),
            torch.ones(tree.size, dtype=torch.float64),
        ),
        dim=-1,
    )
    pair = transform(pair, [tree], _paired(parts))
    return pair[:, 0].round().long(), pair[:, 1]


def _parts_on(tree, by_cls: dict) -> list[int]:
    """Positions in ``fs`` of the parts on a class of ``tree``'s leaves, in order."""
    classes = {leaf.cls for leaf in leaves(tree)}
    return sorted(k for c in classes for k in by_cls.get(c, ()))
