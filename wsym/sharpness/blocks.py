"""GL and GL(1) blocks of a SymmetrySpec: which groups are blocks, and their gather/scatter.

A ``gl`` group gives one :class:`~wsym.sharpness.geometry.Pair` ``(G, H)`` batched over its
index axes (``G`` the stack of its parity-0 rows, ``H`` of its parity-1 rows,
exactly as :func:`wsym.group.units.block_matrices`); a ``scaling`` group whose
exponents are all +1 / -1 gives a ``GL(1)`` block per unit. :func:`block_groups`
chooses the groups used as blocks (no overlaps), :func:`gather` reads their
blocks from a parameter dict and :func:`scatter`, its adjoint and inverse,
writes tangents back. See :mod:`wsym.sharpness.quotient` for the rules and
:class:`wsym.sharpness.quotient.Quotient` for the fast, stacked form used by the ascent.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from wsym.errors import SymmetryWarning
from wsym.group import layout
from wsym.group.kinds import kind_of
from wsym.group.layout import class_params, transform
from wsym.group.memo import derived
from wsym.group.spec import Group, SymmetrySpec
from wsym.sharpness.geometry import Pair

__all__ = [
    "block_groups",
    "gather",
    "gather_group",
    "gl_groups",
    "is_gl1",
    "scatter",
    "scatter_group",
]


def _group_params(spec: SymmetrySpec, group: Group, names) -> list[str]:
    """Parameters (present in ``names``) with an axis of ``group``'s class, in spec order."""
    return [p for p in class_params(spec, group.cls) if p in names]


def _scaling_exps(group: Group) -> dict[int, int]:
    return {var: e for var, e in group.exponents if e}


def is_gl1(group: Group) -> bool:
    """A ``scaling`` group whose exponents are all +1/-1, both present."""
    exps = set(_scaling_exps(group).values())
    kind = kind_of(group)
    return kind.diagonal and kind.continuous and not kind.one_sided and exps == {1, -1}


def _touched(spec: SymmetrySpec, group: Group, params: dict) -> dict[str, Tensor]:
    """``{name: bool}``: entries a continuous group changes (every block holding its class)."""
    layout = spec.layout
    k = kind_of(group)
    exps = _scaling_exps(group) if k.diagonal and k.continuous else None
    out = {}
    for p in _group_params(spec, group, params):

        def one(block, lv):
            hit = any(
                leaf.cls == group.cls and (exps is None or exps.get(leaf.var, 0)) for leaf in lv
            )
            return torch.ones_like(block) if hit else block

        out[p] = transform(torch.zeros_like(params[p], dtype=torch.bool), list(layout[p]), one)
    return out


def gather_group(spec: SymmetrySpec, group: Group, tensors: dict) -> dict[int, Tensor]:
    """``{parity: (*index, rows, h)}`` of ``group`` (:func:`wsym.group.layout.gather`).

    GL(1) scaling groups: parity 0 holds the exponent +1 entries, parity 1 the
    exponent -1 entries, as ``(n_units, rows, 1)``.
    """
    return layout.gather(spec, group, tensors)


def scatter_group(
    spec: SymmetrySpec, group: Group, pair: Pair, like: dict[str, Tensor]
) -> dict[str, Tensor]:
    """Parameter-shaped tensors holding ``pair``'s rows (zero elsewhere); inverse of gathering."""
    parts = {k: m for k, m in ((0, pair.G), (1, pair.H)) if m.shape[-2] > 0}
    return layout.scatter(spec, group, parts, like)


def _pair(parts: dict[int, Tensor]) -> Pair:
    """``Pair(G, H)`` of gathered parities; a missing parity is an empty ``(*index, 0, h)``."""
    like = next(iter(parts.values()))
    empty = like.new_zeros((*like.shape[:-2], 0, like.shape[-1]))
    return Pair(parts.get(0, empty), parts.get(1, empty))


def gl_groups(spec: SymmetrySpec, params: dict[str, Tensor]) -> list[int]:
    """Indices of the GL and orthogonal groups used as blocks, without overlaps.

    A GL group needs both parities (the two factors of its product); an orthogonal
    group acts alike on both (``x -> x R``), so either may be missing.
    """
    taken: dict[str, Tensor] = {}
    chosen = []
    for i, group in enumerate(spec.groups):
        kind = kind_of(group)
        if not kind.matrix or not _group_params(spec, group, params):
            continue
        parts = gather_group(spec, group, params)
        if not parts or (not kind.self_dual and set(parts) != {0, 1}):
            continue
        if any(part.shape[-2] < group.size for part in parts.values()):
            _warn_degenerate(group)
            continue
        mask = _mask(spec, group, params)
        if any((taken[p] & m).any() for p, m in mask.items() if p in taken):
            continue
        for p, m in mask.items():
            taken[p] = taken[p] | m if p in taken else m
        chosen.append(i)
    return chosen


def _warn_degenerate(group: Group) -> None:
    """A factor with fewer rows than the block's size has a singular Gram matrix.

    The invariant and mixed metrics weigh each factor by the other's Gram matrix
    (or its inverse), so they are degenerate on such a block: it is left out of
    the quotient, and the measure is not invariant under that group.
    """
    warnings.warn(
        f"{group.notation} on {', '.join(group.params[:2])} has a factor with fewer rows "
        "than its size (a singular Gram matrix): the quotient leaves it out, so the "
        "geodesic measure is not invariant under it",
        SymmetryWarning,
        stacklevel=5,
    )


def _mask(spec: SymmetrySpec, group: Group, params: dict) -> dict[str, Tensor]:
    parts = _pair(gather_group(spec, group, params))
    ones = Pair(torch.ones_like(parts.G), torch.ones_like(parts.H))
    return {p: t != 0 for p, t in scatter_group(spec, group, ones, params).items()}


def _overlaps(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return any((a[p] & m).any() for p, m in b.items() if p in a)


def block_groups(spec: SymmetrySpec, params: dict[str, Tensor]) -> list[int]:
    """GL/orthogonal groups of :func:`gl_groups`, then the scaling groups usable as GL(1) blocks.

    Depends on the parameters' names and shapes only (memoized on the spec).
    """
    key = ("block_groups", tuple((p, tuple(t.shape)) for p, t in params.items()))
    return list(derived(spec, key, lambda: _block_groups(spec, params)))


def _block_groups(spec: SymmetrySpec, params: dict[str, Tensor]) -> tuple[int, ...]:
    chosen = gl_groups(spec, params)
    taken: dict[str, Tensor] = {}
    for i in chosen:
        for p, m in _mask(spec, spec.groups[i], params).items():
            taken[p] = taken[p] | m if p in taken else m
    touched = {
        i: _touched(spec, g, params)
        for i, g in enumerate(spec.groups)
        if kind_of(g).continuous and not kind_of(g).additive and g.cls >= 0
    }
    # per entry, how many continuous groups touch it: a candidate overlaps another group
    # where the count exceeds its own touch (one pass, not one per pair of groups)
    count: dict[str, Tensor] = {}
    for t in touched.values():
        for p, m in t.items():
            count[p] = count[p] + m if p in count else m.to(torch.int32)
    for i, group in enumerate(spec.groups):
        if not is_gl1(group) or not _group_params(spec, group, params):
            continue
        if set(gather_group(spec, group, params)) != {0, 1}:
            continue
        mask = _mask(spec, group, params)
        own = touched[i]
        if any(not torch.equal(own[p], mask.get(p, torch.zeros_like(own[p]))) for p in own):
            continue  # an entry it rescales lies outside its block
        others = {
            p: count[p] - (own[p].to(torch.int32) if p in own else 0) > 0
            for p in mask
            if p in count
        }
        if _overlaps(taken, mask) or _overlaps(others, mask):
            continue
        chosen.append(i)
    return tuple(chosen)


def gather(spec: SymmetrySpec, params: dict[str, Tensor]) -> list[tuple[int, Pair]]:
    """``[(group index, Pair(G, H))]`` for the blocks of :func:`block_groups`."""
    out = []
    for i in block_groups(spec, params):
        out.append((i, _pair(gather_group(spec, spec.groups[i], params))))
    return out


def scatter(
    spec: SymmetrySpec, tangents: list[tuple[int, Pair]], like: dict[str, Tensor]
) -> dict[str, Tensor]:
    """Sum over groups of their pairs, written into tensors shaped like ``like``."""
    out = {p: torch.zeros_like(t) for p, t in like.items()}
    for i, pair in tangents:
        for p, t in scatter_group(spec, spec.groups[i], pair, like).items():
            out[p] = out[p] + t
    return out
