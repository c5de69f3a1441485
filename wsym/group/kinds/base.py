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

import torch
from torch import Tensor

from wsym.group.layout import map_blocks
from wsym.group.spec import Group, SymmetrySpec, leaves


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
    return per_copy_rows(group, block, lv, ax).sum(-1)


def per_copy_rows(group: Group, block: Tensor, lv, ax: int) -> Tensor:
    """``(*index, n, features)``: per copy, one row per unit of ``block``'s class axis ``ax``.

    ``(n, features)`` for a group without index classes.
    """
    src = [*(_index_axis(group, lv, c) for c in group.index), ax]
    moved = block.movedim(src, list(range(len(src))))
    return moved.reshape(*moved.shape[: len(src)], -1)


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
