"""Reading a state dict class by class: the slices of every unit of an atom class.

A class (a hidden layer's neurons, a head's query/key features) appears in
several tensors, possibly inside products and concatenations of axes. These
helpers gather, for one class, a matrix with one row per unit (``unit_matrix``),
per-unit sums (``unit_sums``) or, for GL/orthogonal groups, one ``(rows, h)``
matrix per index value and parity (``block_matrices``, the block reader
:func:`wsym.group.layout.gather`), in a fixed order that depends only on the spec.

A permutation, scaling or sign group with index classes (one ``S_n`` per expert of a
mixture of experts) is read per copy: its rows are ``(*index, n, features)`` and its
sums ``(*index, n)``, index-major as its values are (:func:`wsym.group.kinds.base.per_unit`).
"""

from __future__ import annotations

import torch

from wsym.group.kinds.base import per_copy_rows
from wsym.group.layout import block_at, block_plan, blocks_with, class_params, gather
from wsym.group.layout import plan_leaves as _plan_leaves
from wsym.group.memo import derived
from wsym.group.registry import kind_of
from wsym.group.spec import Group, SymmetrySpec


def _class_blocks(spec: SymmetrySpec, sd: dict, cls: int, with_buffers: bool = False) -> list:
    """Leaf-level blocks ``(block, leaves)`` holding an axis of class ``cls`` (only those read).

    Which blocks those are is found once per spec (:func:`_class_slots`); each is read by
    :func:`~wsym.group.layout.block_at`.
    """
    return [block_at(spec, p, sd[p], b) for p, b in _class_slots(spec, cls, with_buffers)]


def _class_slots(spec: SymmetrySpec, cls: int, with_buffers: bool = False) -> tuple:
    """``((param, block number), ...)`` of the blocks with an axis of class ``cls``, memoized."""

    def where():
        out = []
        for p in class_params(spec, cls, with_buffers):
            lvs = _plan_leaves(block_plan(spec, p))
            out.extend((p, b) for b, lv in enumerate(lvs) if any(leaf.cls == cls for leaf in lv))
        return tuple(out)

    return derived(spec, ("class_blocks", cls, with_buffers), where)


def _exponent_slots(spec: SymmetrySpec, group: Group) -> tuple:
    """``((param, block number, axis, exponent), ...)``: the class axes with an exponent, memoized.

    In :func:`_class_blocks`' order, axes in order within a block (as :func:`unit_sums` reads).
    """

    def where():
        exps = dict(group.exponents)
        out = []
        for p, b in _class_slots(spec, group.cls):
            for ax, leaf in enumerate(_plan_leaves(block_plan(spec, p))[b]):
                if leaf.cls == group.cls and exps.get(leaf.var, 0):
                    out.append((p, b, ax, exps[leaf.var]))
        return tuple(out)

    return derived(spec, ("exponent_slots", group), where)


def per_class_only(group: Group, who: str) -> None:
    """Refuse, in one line, a permutation/scaling/sign group with one copy per index value.

    Such a group (one ``S_n`` per expert of a mixture of experts) moves each
    index value's units apart; a consumer that reads one row per unit of the class
    would treat it as one shared copy (the readers here read it per copy).
    """
    from wsym.errors import WsymInputError

    if group.index and not kind_of(group).matrix:
        raise WsymInputError(
            f"{group.notation} ({group.kind}) holds one copy per expert (index value); "
            f"{who} reads one copy per class: leave the {group.kind} kind out (kinds=...) "
            f"or drop the group from the spec"
        )


def unit_matrix(
    spec: SymmetrySpec, sd: dict, cls: int, with_buffers: bool = False, group: Group | None = None
) -> torch.Tensor:
    """``(n, features)``: every entry of every tensor, grouped by unit of class ``cls``.

    ``(*index, n, features)`` per copy for a ``group`` of the class with index classes.
    """
    cols = []
    for block, lv in _class_blocks(spec, sd, cls, with_buffers):
        ax = next(i for i, leaf in enumerate(lv) if leaf.cls == cls)
        cols.append(unit_rows(group, block, lv, ax))
    return torch.cat(cols, dim=-1)


def unit_rows(group: Group | None, block: torch.Tensor, lv, ax: int) -> torch.Tensor:
    """``block``'s rows along class axis ``ax``: ``(n, f)``, or ``(*index, n, f)`` per copy."""
    if group is not None and group.index:
        return per_copy_rows(group, block, lv, ax)
    return block.movedim(ax, 0).reshape(block.shape[ax], -1)


class ClassRows:
    """The rows of :func:`unit_matrix` left unread: products are taken block by block.

    ``a.product(b)`` is ``unit_matrix(a's state) @ unit_matrix(b's state).T``
    without forming either matrix: one ``tensordot`` per parameter block over
    every axis but the class's, so that only one block's temporary is held at a
    time instead of a copy of every tensor the class touches.

    Shapes:
        ``product`` returns ``(n, n)``.

    Example:
        >>> import torch, wsym
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> spec = wsym.detect(mlp, torch.randn(2, 3))
        >>> a, b = mlp.state_dict(), {k: v + 1 for k, v in mlp.state_dict().items()}
        >>> cls = spec.groups[0].cls
        >>> full = unit_matrix(spec, a, cls) @ unit_matrix(spec, b, cls).T
        >>> torch.allclose(ClassRows(spec, a, cls).product(ClassRows(spec, b, cls)), full)
        True
    """

    def __init__(self, spec: SymmetrySpec, sd: dict, cls: int):
        self.spec, self.sd, self.cls = spec, sd, cls

    def product(self, other: ClassRows) -> torch.Tensor:
        """``(n, n)``: the sum over blocks of this state's rows times ``other``'s, transposed."""
        total = None
        mine = _class_blocks(self.spec, self.sd, self.cls)
        theirs = _class_blocks(other.spec, other.sd, other.cls)
        for (a, lv), (b, _) in zip(mine, theirs, strict=True):
            ax = next(i for i, leaf in enumerate(lv) if leaf.cls == self.cls)
            rest = [i for i in range(a.dim()) if i != ax]
            part = torch.tensordot(a, b, dims=(rest, rest)) if rest else torch.outer(a, b)
            total = part if total is None else total.add_(part)
        return total


def block_matrices(spec: SymmetrySpec, sd: dict, group: Group) -> dict[int, torch.Tensor]:
    """GL/orthogonal group: ``{parity: (*index, rows, h)}`` over all its parameter blocks.

    Blocks that hold the class axis twice are left out (their rows are not a
    plain stack of vectors transforming alike). This is :func:`wsym.group.layout.gather`.
    """
    return gather(spec, group, sd)


def unit_sums(
    spec: SymmetrySpec, sd: dict, group: Group, power: int = 2
) -> dict[int, torch.Tensor]:
    """Scaling/sign group: ``{exponent: per-unit sum of |entry|**power}`` over parameters."""
    exps = dict(group.exponents)
    out: dict[int, torch.Tensor] = {}
    for block, lv in _class_blocks(spec, sd, group.cls):
        for ax, leaf in enumerate(lv):
            e = exps.get(leaf.var, 0)
            if leaf.cls == group.cls and e:
                rows = unit_rows(group, block, lv, ax)
                rows = (rows * rows).sum(-1) if power == 2 else rows.abs().pow(power).sum(-1)
                out[e] = out.get(e, 0) + rows
    return out


def unit_moments(
    spec: SymmetrySpec, sd: dict, other: dict, group: Group
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """Scaling group: per exponent, the per-unit sums of ``entry**2`` and ``entry * other's``.

    Both from one read of each block (``unit_sums(spec, sd, group)`` is the first).

    Shapes:
        every value ``(n,)`` (``(*index, n)`` per copy).
    """
    squares: dict[int, torch.Tensor] = {}
    inner: dict[int, torch.Tensor] = {}
    for p, b, ax, e in _exponent_slots(spec, group):
        sq, cross = _block_moments(spec, p, sd, other, b, ax, group)
        squares[e] = squares.get(e, 0) + sq
        inner[e] = inner.get(e, 0) + cross
    return squares, inner


def key_moments(
    spec: SymmetrySpec, sd: dict, other: dict, group: Group, key: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per unit of ``group``'s class, the sums of ``entry**2`` and ``entry * other's`` over ``key``.

    Every entry of ``key`` on the unit counts, whatever its exponent (a BatchNorm
    weight that a ``norm_scaling`` corrects).

    Shapes:
        returns two ``(n,)`` (``(*index, n)`` per copy).
    """
    squares = inner = torch.zeros((), dtype=sd[key].dtype)
    leaves = _plan_leaves(block_plan(spec, key))
    for b in blocks_with(spec, key, group.cls):
        ax = next(i for i, leaf in enumerate(leaves[b]) if leaf.cls == group.cls)
        sq, cross = _block_moments(spec, key, sd, other, b, ax, group)
        squares, inner = squares + sq, inner + cross
    return squares, inner


def _block_moments(
    spec: SymmetrySpec, key: str, sd: dict, other: dict, b: int, ax: int, group: Group
):
    """Per row along axis ``ax`` of block ``b`` of ``key``: sums of squares and of products.

    Per copy where ``group`` has index classes.
    """
    block, lv = block_at(spec, key, sd[key], b)
    second, _ = block_at(spec, key, other[key], b)
    rows, rows_other = unit_rows(group, block, lv, ax), unit_rows(group, second, lv, ax)
    return (rows * rows).sum(-1), (rows * rows_other).sum(-1)


def odd_rows(
    spec: SymmetrySpec, sd: dict, group: Group, pending=frozenset(), shared=frozenset()
) -> torch.Tensor | None:
    """Sign group: ``(n, features)`` of the entries a flip of each unit negates.

    Per copy (``(*index, n, features)``) where the group has index classes. Blocks
    that also hold an axis of a class in ``pending`` (whose own sign convention is
    not fixed yet) are left out, and so are the leaf variables in ``shared``
    (negated by another sign group of the same class, not settled yet); None if
    nothing is left.
    """
    exps = dict(group.exponents)
    cols = []
    for block, lv in _class_blocks(spec, sd, group.cls):
        if any(leaf.cls in pending for leaf in lv if leaf.cls != group.cls):
            continue
        for ax, leaf in enumerate(lv):
            if leaf.cls == group.cls and exps.get(leaf.var, 0) % 2 and leaf.var not in shared:
                cols.append(unit_rows(group, block, lv, ax))
    return torch.cat(cols, dim=-1) if cols else None


def odd_patterns(spec: SymmetrySpec, sd: dict, groups) -> list[tuple[tuple, torch.Tensor]]:
    """Sign groups ``groups`` of one class: ``[(pattern, (n, features) rows), ...]``.

    One item per class axis that some of them negate, ``pattern`` the positions in
    ``groups`` of those that do (a unit's entry there is multiplied by the product of
    their signs); in a fixed order, so two state dicts' lists pair item by item.
    """
    cls = spec.groups[groups[0]].cls
    odd = [{v for v, e in spec.groups[j].exponents if e % 2} for j in groups]
    out = []
    for block, lv in _class_blocks(spec, sd, cls):
        for ax, leaf in enumerate(lv):
            pattern = tuple(k for k, vs in enumerate(odd) if leaf.var in vs)
            if leaf.cls == cls and pattern:
                out.append((pattern, block.movedim(ax, 0).reshape(block.shape[ax], -1)))
    return out


def shared_odd(spec: SymmetrySpec, i: int, among) -> frozenset:
    """Leaf variables that a sign group in ``among`` (not ``i``) of group ``i``'s class negates.

    Several sign groups on one class (a residual stream read by several
    BatchNorms or LayerNorms) may negate some of the same entries; what group
    ``i`` reads of its own sign leaves those out (:func:`odd_rows`' ``shared``).
    """
    cls = spec.groups[i].cls
    return frozenset(
        v
        for j in among
        if j != i and kind_of(spec.groups[j]).flips and spec.groups[j].cls == cls
        for v, e in spec.groups[j].exponents
        if e % 2
    )


def own_odd_rows(spec: SymmetrySpec, sd: dict, i: int, among, pending=frozenset()):
    """:func:`odd_rows` of sign group ``i`` less the entries of :func:`shared_odd`.

    With those entries where nothing else is left.
    """
    group = spec.groups[i]
    rows = odd_rows(spec, sd, group, pending, shared_odd(spec, i, among))
    return rows if rows is not None else odd_rows(spec, sd, group, pending)


def block_classes(spec: SymmetrySpec, group: Group, itself: bool = False) -> set[int]:
    """Classes that share a parameter block with ``group``'s class.

    With ``itself``, the class itself is included when a block holds its axis
    twice (a permutation of the class then changes its own unit rows).
    """

    def compute():
        out = set()
        for p in class_params(spec, group.cls):
            for lv in _plan_leaves(block_plan(spec, p)):
                mine = sum(leaf.cls == group.cls for leaf in lv)
                if mine:
                    out.update(leaf.cls for leaf in lv if leaf.cls != group.cls)
                if itself and mine > 1:
                    out.add(group.cls)
        return frozenset(out)

    return set(derived(spec, ("block_classes", group, itself), compute))
