"""Translations: add a constant that a softmax or a mean removes.

The group's ``target`` is ``(param, signature, mode)``: mode ``"uniform"`` adds one
scalar to the whole parameter (a logit bias before a softmax); mode ``"full"``
adds a tensor ``c`` (the parameter's shape) on the blocks of the parameter whose
leaves match the signature (a key bias: ``c`` restricted to those blocks).
Composition adds, the inverse negates; the action is affine, so the
one-parameter subgroup is ``t a`` itself and the generator ``J a = mask * a``
(``a`` itself in uniform mode) does not depend on the point; its adjoint is
``mask * y`` (``sum y`` in uniform mode).

Example:
    >>> import torch
    >>> from wsym.group.spec import Group, Leaf
    >>> g = Group("translation", 3, 1, ("b",), target=("b", (), "uniform"))
    >>> k = Translation()
    >>> k.compose(g, torch.tensor(1.0), k.inverse(g, torch.tensor(1.0))).item(), k.notation(g)
    (0.0, 'R^3')
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsym.group.kinds.base import Kind, log_uniform
from wsym.group.layout import transform
from wsym.group.spec import Group, Leaf, SymmetrySpec


class Translation(Kind):
    """``R^n``: shifts of a parameter that the next operation removes."""

    name = "translation"
    fusable = False  # acts by adding to its target, not block by block
    local = False
    continuous = True
    additive = True

    def symbol(self, group: Group) -> str:
        """``R^n``."""
        return f"R^{group.size}"

    def copy_dimension(self, h: int) -> int:
        """``h``."""
        return h

    def extra_axes(self, group: Group) -> list[tuple[str, int]]:
        """The target parameter's first axis."""
        return [(group.target[0], 0)]

    def shape(self, spec: SymmetrySpec, group: Group) -> tuple[int, ...]:
        """Shape of a value: ``()`` in uniform mode, else the parameter's."""
        key, _, mode = group.target
        return () if mode == "uniform" else tuple(t.size for t in spec.layout[key])

    def sample(self, spec: SymmetrySpec, group: Group, gen, scale=(1e-2, 1e2), moving=False):
        """Gaussian direction times a log-uniform length in ``scale``."""
        shape = self.shape(spec, group)
        return torch.randn(shape, generator=gen, dtype=torch.float64) * log_uniform((), scale, gen)

    def inverse(self, group: Group, value):
        """``-c``."""
        return -value

    def compose(self, group: Group, a, b):
        """``a + b``."""
        return a + b

    def act(self, spec: SymmetrySpec, group: Group, value, state: dict) -> dict[str, Tensor]:
        """The target parameter with ``c`` added where the signature matches."""
        key = group.target[0]
        return {key: translate(group, value, state[key], spec.layout[key])}

    def coefficient_shape(self, spec: SymmetrySpec, group: Group) -> tuple[int, ...]:
        """The value's shape."""
        return self.shape(spec, group)

    def exp(self, group: Group, a: Tensor):
        """The translation by ``a`` itself."""
        return a

    def generator(self, spec: SymmetrySpec, group: Group, state: dict, a: Tensor) -> dict:
        """``mask * a`` (``a`` everywhere in uniform mode)."""
        key = group.target[0]
        zero = torch.zeros_like(state[key], dtype=a.dtype)
        return {key: translate(group, a, zero, spec.layout[key])}

    def generator_adjoint(self, spec: SymmetrySpec, group: Group, state: dict, y: dict) -> Tensor:
        """``mask * y`` (``sum y`` in uniform mode)."""
        key, _, mode = group.target
        if key not in y:
            return torch.zeros(self.shape(spec, group), dtype=torch.float64)
        if mode == "uniform":
            return y[key].sum()
        return y[key] * mask(spec, group, y[key].dtype)


def translate(group: Group, value, t: Tensor, trees) -> Tensor:
    """``t`` plus the constant on the blocks whose leaves match the group's signature."""
    _, sig, mode = group.target
    sig = {tuple(x) for x in sig}
    c = value.to(t.dtype)
    if mode == "uniform":
        return t + c
    stacked = torch.stack([t, c.reshape(t.shape)])

    def fn(block, lv):
        inner = lv[1:]
        if any(leaf.size > 1 for leaf in inner) and all((x.cls, x.parity) in sig for x in inner):
            return torch.stack([block[0] + block[1], block[1]])
        return block

    return transform(stacked, [Leaf(-2, 2, 0, -1), *trees], fn)[0]


def mask(spec: SymmetrySpec, group: Group, dtype=torch.float64) -> Tensor:
    """1 on the entries a full translation moves, 0 elsewhere."""
    key = group.target[0]
    trees = spec.layout[key]
    shape = tuple(t.size for t in trees)
    ones = torch.ones(shape, dtype=dtype)
    return translate(group, ones, torch.zeros(shape, dtype=dtype), trees)


def translation_size(group: Group, trees) -> int:
    """Number of parameter entries a (full) translation group moves."""
    shape = tuple(t.size for t in trees)
    zeros = torch.zeros(shape, dtype=torch.float64)
    ones = torch.ones(shape, dtype=torch.float64)
    return int(translate(group, ones, zeros, trees).count_nonzero())
