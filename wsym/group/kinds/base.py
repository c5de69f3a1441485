"""The base class of the symmetry kinds: what every consumer may ask of a group.

A :class:`Kind` is stateless; it reads the :class:`~wsym.group.spec.Group` (and
the spec, for layouts) it is handed. A group's *value* is one element of it
(a permutation, a scale vector, a matrix per index, a translation);
:meth:`Kind.act` applies one value to the tensors the group moves,
:meth:`Kind.inverse` and :meth:`Kind.compose` are the group laws, with
``act(compose(a, b)) == act(a) after act(b)``.

Continuous kinds also give their infinitesimal action. With a coefficient
``a`` of shape :meth:`Kind.coefficient_shape` and the one-parameter subgroup
``t -> exp(t a)`` (:meth:`Kind.exp`), the *generator* at a point theta is the
tangent vector ``J a = d/dt (exp(t a) . theta)`` at ``t = 0`` (a vertical
vector), and :meth:`Kind.generator_adjoint` is its Euclidean adjoint
``J^T y`` (``<J a, y> = <a, J^T y>``).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from wsym.group.layout import map_blocks, transform
from wsym.group.memo import derived
from wsym.group.registry import kind_of
from wsym.group.spec import Group, Split, SymmetrySpec, leaves


class Kind:
    """One kind of symmetry group (subclasses: one per kind).

    Attributes:
        name: the kind's name, as in :data:`wsym.group.spec.KINDS`.
        continuous: a Lie group of positive dimension (else finite).
        diagonal: acts by multiplying each entry by a per-unit factor (``s**e``).
        matrix: acts by one matrix per index on the class axis (``x M`` / ``x M^-T``).
        permutes: reorders the units of its class.
        flips: a finite diagonal kind (factors +-1).
        one_sided: a diagonal kind acting on one side of its units only (every
            exponent positive: the weights feeding a normalization), so that
            its orbits hold every norm.
        self_dual: a matrix kind with ``M^-T = M`` (orthogonal): both parities
            transform alike.
        additive: acts by adding a constant (translations).
        fusable: :meth:`act` is what :meth:`chain_parts` lists, applied block by block,
            so that several elements act in one pass per tensor (:func:`act_chain`).
        reads_state: :meth:`chain_parts` reads the state it acts on (so that
            :func:`~wsym.group.elements.act` puts it in a later pass than any earlier
            part on its classes).
        axis_map: how :meth:`block_fn` acts, where it acts on each class axis alone
            (no index classes): ``"index"`` (it reorders the axis), ``"factor"`` (it
            multiplies it entrywise), or ``""`` (neither, e.g. a matrix per index).
        local: :meth:`act` changes only the blocks of the group's class and index
            classes, reading nothing else, so it commutes with any element acting on
            other classes (fusable kinds are local; ``act`` moves a local part past
            later fusable ones on other classes, to fuse those).
    """

    name: ClassVar[str] = ""
    continuous: ClassVar[bool] = False
    diagonal: ClassVar[bool] = False
    matrix: ClassVar[bool] = False
    permutes: ClassVar[bool] = False
    flips: ClassVar[bool] = False
    one_sided: ClassVar[bool] = False
    self_dual: ClassVar[bool] = False
    additive: ClassVar[bool] = False
    fusable: ClassVar[bool] = True
    reads_state: ClassVar[bool] = False
    local: ClassVar[bool] = True
    axis_map: ClassVar[str] = ""

    # -- description -----------------------------------------------------
    def symbol(self, group: Group) -> str:
        """The group of one copy in the usual notation, e.g. ``GL(4)``."""
        raise NotImplementedError

    def notation(self, group: Group) -> str:
        """The whole group, e.g. ``GL(4)^2`` for two copies (``((R+)^4)^2`` for diagonal kinds)."""
        base = self.symbol(group)
        if group.count > 1 and self.diagonal:
            base = f"({base})"
        return f"{base}^{group.count}" if group.count > 1 else base

    def copy_dimension(self, h: int) -> int:
        """Dimension of one copy acting on ``h`` units (0 for finite groups)."""
        return 0

    def dimension(self, group: Group) -> int:
        """Dimension of the group (0 for finite groups)."""
        return self.copy_dimension(group.size) * group.count

    def extra_axes(self, group: Group) -> list[tuple[str, int]]:
        """(param, dim) pairs the group moves outside its class (translations)."""
        return []

    # -- elements --------------------------------------------------------
    def sample(self, spec: SymmetrySpec, group: Group, gen, scale=(1e-2, 1e2), moving=False):
        """A random value (uniform permutations, log-uniform scales)."""
        raise NotImplementedError

    def inverse(self, group: Group, value):
        """The inverse value."""
        raise NotImplementedError

    def compose(self, group: Group, a, b):
        """The value acting as ``b`` first, then ``a``."""
        raise NotImplementedError

    def identity(self, spec: SymmetrySpec, group: Group):
        """The identity value (continuous kinds: ``exp(0)``)."""
        zero = torch.zeros(self.coefficient_shape(spec, group), dtype=torch.float64)
        return self.exp(group, zero)

    def block_fn(self, group: Group, value):
        """``fn(block, leaves) -> block``: the exact action on one leaf-level block."""
        raise NotImplementedError

    def leaf_key(self, group: Group):
        """``key(leaf)``: what :meth:`block_fn` reads of a leaf of the group's class.

        Two leaves of the class with equal keys (and size and relabeling) are acted
        on alike along their axis, so :func:`act_chain` finds that axis map once for
        both. The default, the leaf itself, shares nothing.
        """
        return _itself

    def chain_parts(self, spec: SymmetrySpec, group: Group, value, state: dict) -> list:
        """``[(keys, (class, fn, axis map, leaf key))]``: what :func:`act_chain` applies.

        By default :meth:`block_fn` on the group's parameters.
        """
        mode = self.axis_map if not group.index else ""
        key = self.leaf_key(group) if mode else None
        return [(group.params, (group.cls, self.block_fn(group, value), mode, key))]

    def act(self, spec: SymmetrySpec, group: Group, value, state: dict) -> dict[str, Tensor]:
        """The tensors of ``state`` that ``value`` changes, acted on."""
        fn = self.block_fn(group, value)
        cls = group.cls if group.cls >= 0 else None  # block_fn moves only the class's blocks
        return {key: map_blocks(spec, key, state[key], fn, cls) for key in group.params}

    # -- infinitesimal action (continuous kinds) -------------------------
    def coefficient_shape(self, spec: SymmetrySpec, group: Group) -> tuple[int, ...]:
        """Shape of a Lie-algebra coefficient ``a``."""
        raise TypeError(f"{self.name} groups are finite: they have no generators")

    def exp(self, group: Group, a: Tensor):
        """The value ``exp(a)`` of the one-parameter subgroup at ``t = 1``."""
        raise TypeError(f"{self.name} groups are finite: they have no generators")

    def generator(self, spec: SymmetrySpec, group: Group, state: dict, a: Tensor) -> dict:
        """``J a = d/dt (exp(t a) . state)`` at ``t = 0``, on every tensor the group moves."""
        raise TypeError(f"{self.name} groups are finite: they have no generators")

    def generator_adjoint(self, spec: SymmetrySpec, group: Group, state: dict, y: dict) -> Tensor:
        """``J^T y`` (shape :meth:`coefficient_shape`); keys missing from ``y`` count as zero."""
        raise TypeError(f"{self.name} groups are finite: they have no generators")


def _itself(leaf):
    return leaf


def along(vec: Tensor, axis: int, ndim: int) -> Tensor:
    """``vec`` shaped to broadcast along ``axis`` of an ``ndim``-dimensional tensor."""
    shape = [1] * ndim
    shape[axis] = -1
    return vec.reshape(shape)


def per_unit(group: Group, value: Tensor, lv, ax: int, ndim: int) -> Tensor:
    """``value`` (``(*index, n)``) shaped to broadcast along a block's index axes and axis ``ax``.

    A group with index classes (one copy per index value: per head, per expert)
    reads its copy at each index value; every block it acts on must hold each
    index class once (else a one-line ValueError).
    """
    if not group.index:
        return along(value, ax, ndim)
    if value.ndim != len(group.index) + 1:
        raise ValueError(
            f"{group.notation} ({group.kind}) has one copy per index value: "
            f"its value has shape (*index, {group.size}), not {tuple(value.shape)}"
        )
    positions = [*(_index_axis(group, lv, c) for c in group.index), ax]
    order = sorted(range(len(positions)), key=positions.__getitem__)
    shape = [1] * ndim
    for i in order:
        shape[positions[i]] = value.shape[i]
    return value.permute(order).reshape(shape)


def _index_axis(group: Group, lv, cls: int) -> int:
    hits = [i for i, leaf in enumerate(lv) if leaf.cls == cls]
    if len(hits) != 1:
        raise ValueError(
            f"{group.notation} ({group.kind}) is indexed by class {cls}, which a block of "
            f"its class holds {len(hits)} times (it must hold it once)"
        )
    return hits[0]


def per_copy_sums(group: Group, block: Tensor, lv, ax: int) -> Tensor:
    """``(*index, n)``: per copy and unit, the sum of ``block``'s entries (class axis ``ax``)."""
    src = [*(_index_axis(group, lv, c) for c in group.index), ax]
    moved = block.movedim(src, list(range(len(src))))
    return moved.reshape(*moved.shape[: len(src)], -1).sum(-1)


def log_uniform(shape, scale, gen) -> Tensor:
    """Float64 samples with ``log`` uniform on ``[log scale[0], log scale[1]]``."""
    lo, hi = math.log(scale[0]), math.log(scale[1])
    return torch.exp(lo + (hi - lo) * torch.rand(tuple(shape), generator=gen, dtype=torch.float64))


def random_orthogonal(shape, n, gen, special: bool = False) -> Tensor:
    """Haar-random ``(*shape, n, n)`` orthogonal matrices (rotations with ``special``)."""
    a = torch.randn(*shape, n, n, generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    if special:  # flip one column where the determinant is -1
        det = torch.linalg.det(q)
        q[..., :, 0] = q[..., :, 0] * det.sign().unsqueeze(-1)
    return q


def index_sizes(spec: SymmetrySpec, group: Group) -> list[int]:
    """Sizes of the group's index classes (one copy per index value)."""
    if not group.index:
        return []
    sizes = {}
    for _, dims in spec.layouts:
        for t in dims:
            for leaf in leaves(t):
                sizes[leaf.cls] = leaf.size
    return [sizes[c] for c in group.index]


def value_shape(spec: SymmetrySpec, group: Group) -> tuple[int, ...]:
    """``(*index, n)``: the shape of a per-unit value (a permutation, scales, signs)."""
    return (*index_sizes(spec, group), group.size)


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
