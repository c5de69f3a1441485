"""Permutations: reorder the units of a class along every axis it labels.

A value is a permutation ``perm`` of ``range(n)``; acting takes ``t[..., perm, ...]``
on each class axis, so ``compose(a, b) = b[a]`` (``b`` first) and the inverse is
``argsort(perm)``. Finite: no generators.

Example:
    >>> import torch
    >>> from wsym.group.spec import Group
    >>> g = Group("permutation", 3, 1, ("w",), cls=0)
    >>> k = Permutation()
    >>> a, b = torch.tensor([2, 0, 1]), torch.tensor([1, 2, 0])
    >>> k.compose(g, a, b).tolist(), k.inverse(g, a).tolist(), k.notation(g)
    ([0, 1, 2], [1, 2, 0], 'S_3')
"""

from __future__ import annotations

import torch

from wsym.group.kinds.base import Kind
from wsym.group.spec import Group, SymmetrySpec


class Permutation(Kind):
    """``S_n``: reorder the units (hidden neurons, channels, heads, the residual stream)."""

    name = "permutation"
    permutes = True
    axis_map = "index"

    def symbol(self, group: Group) -> str:
        """``S_n``."""
        return f"S_{group.size}"

    def sample(self, spec: SymmetrySpec, group: Group, gen, scale=(1e-2, 1e2), moving=False):
        """A uniform permutation (with ``moving``: a random n-cycle, every unit moves)."""
        perm = torch.randperm(group.size, generator=gen)
        if not moving:
            return perm
        cycle = torch.empty_like(perm)
        cycle[perm] = perm.roll(-1)
        return cycle

    def identity(self, spec: SymmetrySpec, group: Group):
        """``arange(n)``."""
        return torch.arange(group.size)

    def inverse(self, group: Group, value):
        """``argsort(perm)``."""
        return torch.argsort(value)

    def compose(self, group: Group, a, b):
        """``b[a]``: ``t[b]`` then ``[a]`` is ``t[b[a]]``."""
        return b[a]

    def block_fn(self, group: Group, value):
        """Index every class axis of the block with ``perm``."""

        def fn(t, lv):
            for ax, leaf in enumerate(lv):
                if leaf.cls == group.cls:
                    t = t.index_select(ax, value)  # 1.3-2.5x faster than t[..., value]
            return t

        return fn
