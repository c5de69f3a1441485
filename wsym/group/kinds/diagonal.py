"""Diagonal kinds: per-unit factors ``s**e`` on every entry of the unit (``e`` its exponent).

* ``scaling``: ``s in (R+)^n`` (ReLU-type homogeneity: ``e = 1`` on incoming,
  ``e = -1`` on outgoing weights; products and layer-scales give other ``e``);
* ``sign``: ``s in {+-1}^n`` (odd activations), finite;
* ``norm_scaling``: as scaling on the weights feeding a BatchNorm, plus the
  correction of its weight ``gamma -> gamma sqrt(s^2u v + eps) / (s^u sqrt(v + eps))``
  (``v`` the running variance before the move), which keeps eval mode exact.

Composition multiplies the factors (the corrections compose too, since ``v``
moves to ``s^2u v``). One-parameter subgroups ``s = exp(t a)``, ``a in R^n``;
the generator multiplies each entry ``w`` by ``sum_axes e a_unit`` and a
corrected BatchNorm weight by ``-u a eps / (v + eps)`` (the derivative of the
correction's log at ``s = 1``).

Example:
    >>> import torch
    >>> from wsym.group.spec import Group
    >>> g = Group("scaling", 2, 1, ("w",), cls=0, exponents=((0, 1),))
    >>> k = Scaling()
    >>> s = torch.tensor([2.0, 4.0], dtype=torch.float64)
    >>> k.compose(g, s, k.inverse(g, s)).tolist(), k.notation(g), k.dimension(g)
    ([1.0, 1.0], '(R+)^2', 2)
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsym.group.kinds.base import Kind, log_uniform, per_copy_sums, per_unit, value_shape
from wsym.group.layout import blocks_of, map_blocks, transform
from wsym.group.spec import Group, SymmetrySpec


class Sign(Kind):
    """``Z2^n``: flip the sign of a unit's odd-exponent entries."""

    name = "sign"
    diagonal = True
    flips = True
    axis_map = "factor"

    def symbol(self, group: Group) -> str:
        """``Z2^n``."""
        return f"Z2^{group.size}"

    def sample(self, spec: SymmetrySpec, group: Group, gen, scale=(1e-2, 1e2), moving=False):
        """Uniform signs (with ``moving``: at least one unit flips)."""
        shape = value_shape(spec, group)
        signs = torch.randint(0, 2, shape, generator=gen).to(torch.float64) * 2 - 1
        if moving and (signs > 0).all():
            signs.view(-1)[torch.randint(0, signs.numel(), (1,), generator=gen)] = -1
        return signs

    def identity(self, spec: SymmetrySpec, group: Group):
        """All ones (one vector per index value)."""
        return torch.ones(value_shape(spec, group), dtype=torch.float64)

    def inverse(self, group: Group, value):
        """A sign vector is its own inverse."""
        return value

    def compose(self, group: Group, a, b):
        """``a * b``."""
        return a * b

    def leaf_key(self, group: Group):
        """The leaf's exponent: :meth:`block_fn` multiplies by ``value**e``."""
        return _exponent_of(group)

    def block_fn(self, group: Group, value):
        """Multiply each class axis by ``value**e``."""
        return _factor_fn(group, value)


class Scaling(Sign):
    """``(R+)^n``: positive rescalings of a unit (incoming by ``s``, outgoing by ``1/s``)."""

    name = "scaling"
    continuous = True
    flips = False

    def symbol(self, group: Group) -> str:
        """``(R+)^n``."""
        return f"(R+)^{group.size}"

    def copy_dimension(self, h: int) -> int:
        """``h``."""
        return h

    def sample(self, spec: SymmetrySpec, group: Group, gen, scale=(1e-2, 1e2), moving=False):
        """Log-uniform scales in ``scale``."""
        return log_uniform(value_shape(spec, group), scale, gen)

    def inverse(self, group: Group, value):
        """``1 / s``."""
        return 1.0 / value

    def coefficient_shape(self, spec: SymmetrySpec, group: Group) -> tuple[int, ...]:
        """``(*index, n)``: log-scales."""
        return value_shape(spec, group)

    def exp(self, group: Group, a: Tensor):
        """The scales: the elementwise exponential of ``a``."""
        return torch.exp(a)

    def generator(self, spec: SymmetrySpec, group: Group, state: dict, a: Tensor) -> dict:
        """``e a_unit w`` on every entry (summed over the block's class axes)."""
        exps = dict(group.exponents)

        def fn(t, lv):
            out = torch.zeros_like(t)
            for ax, leaf in enumerate(lv):
                e = exps.get(leaf.var, 0)
                if e and leaf.cls == group.cls:
                    out = out + e * per_unit(group, a.to(t.dtype), lv, ax, t.ndim) * t
            return out

        return {
            key: map_blocks(spec, key, state[key], fn, group.cls, zero=True) for key in group.params
        }

    def generator_adjoint(self, spec: SymmetrySpec, group: Group, state: dict, y: dict) -> Tensor:
        """Per unit, ``sum e w y`` over its entries."""
        exps = dict(group.exponents)
        out = torch.zeros(value_shape(spec, group), dtype=_dtype(y))
        for key in group.params:
            if key in y:
                out = out + _unit_sums(spec, key, state[key] * y[key], group, exps)
        return out


class NormScaling(Scaling):
    """``(R+)^n`` on the weights feeding a BatchNorm, with its running statistics and weight."""

    reads_state = True  # it also corrects the BatchNorm weights from the running variances

    name = "norm_scaling"
    one_sided = True

    def chain_parts(self, spec: SymmetrySpec, group: Group, value, state: dict) -> list:
        """As scaling, then each corrected BatchNorm weight times its factor (as :meth:`act`)."""
        parts = super().chain_parts(spec, group, value, state)
        mode = "factor" if not group.index else ""
        for key, f in self.correction_factors(spec, group, value, state).items():
            parts.append(((key,), (group.cls, _unit_fn(group, f), mode, _unit_key)))
        return parts

    def correction_factors(self, spec: SymmetrySpec, group: Group, value, state: dict) -> dict:
        """Per corrected weight, the factor of each unit (from the running variance before)."""
        factors = {}
        for w_key, rv_key, eps, u in group.corrections:
            su, v = value.pow(u), running_var(spec, group, state, rv_key)
            factors[w_key] = torch.sqrt(su**2 * v + eps) / (su * torch.sqrt(v + eps))
        return factors

    def act(self, spec: SymmetrySpec, group: Group, value, state: dict) -> dict[str, Tensor]:
        """Scale, then correct the BatchNorm weights (factors from the running var before)."""
        factors = self.correction_factors(spec, group, value, state)
        out = super().act(spec, group, value, state)
        for key, f in factors.items():
            out[key] = map_blocks(
                spec, key, out.get(key, state[key]), _unit_fn(group, f), group.cls
            )
        return out

    def _corrections(self, spec: SymmetrySpec, group: Group, state: dict) -> list:
        """``[(weight key, d log factor / d a per unit)]``: ``-u eps / (v + eps)``."""
        return [
            (w_key, -u * eps / (running_var(spec, group, state, rv_key) + eps))
            for w_key, rv_key, eps, u in group.corrections
        ]

    def generator(self, spec: SymmetrySpec, group: Group, state: dict, a: Tensor) -> dict:
        """As scaling, plus ``-u a eps / (v + eps)`` times each corrected BatchNorm weight."""
        out = super().generator(spec, group, state, a)
        for key, d in self._corrections(spec, group, state):
            extra = map_blocks(spec, key, state[key], _unit_fn(group, d * a))
            out[key] = out[key] + extra if key in out else extra
        return out

    def generator_adjoint(self, spec: SymmetrySpec, group: Group, state: dict, y: dict) -> Tensor:
        """As scaling, plus the corrections' ``-u eps / (v + eps) gamma y`` per unit."""
        out = super().generator_adjoint(spec, group, state, y)
        for key, d in self._corrections(spec, group, state):
            if key in y:
                ones = {leaf_var: 1 for leaf_var in class_vars(spec, key, group)}
                out = out + d * _unit_sums(spec, key, state[key] * y[key], group, ones)
        return out


def running_var(spec: SymmetrySpec, group: Group, state: dict, rv_key: str) -> Tensor:
    """Float64 ``(n,)``: the running variance of each unit of ``group``'s class."""
    holder = {}

    def grab(t, lv):
        for ax, leaf in enumerate(lv):
            if leaf.cls == group.cls:
                holder["v"] = t.movedim(ax, 0).reshape(leaf.size, -1)[:, 0].to(torch.float64)
        return t

    transform(state[rv_key], list(spec.layout[rv_key]), grab)
    return holder["v"]


def _exponent_of(group: Group):
    exps = dict(group.exponents)
    return lambda leaf: exps.get(leaf.var, 0)


def _factor_fn(group: Group, s: Tensor):
    exps = dict(group.exponents)
    powers: dict = {}  # (exponent, dtype) -> s ** exponent: a DenseNet asks ~8000 times

    def fn(t, lv):
        for ax, leaf in enumerate(lv):
            e = exps.get(leaf.var, 0)
            if e and leaf.cls == group.cls:
                if (e, t.dtype) not in powers:
                    powers[e, t.dtype] = s.pow(e).to(t.dtype)
                t = t * per_unit(group, powers[e, t.dtype], lv, ax, t.ndim)
        return t

    return fn


def _unit_key(leaf):
    return None  # _unit_fn multiplies every leaf of the class alike


def _unit_fn(group: Group, factor: Tensor):
    """Multiply every class axis (whatever its exponent) by ``factor``."""

    def fn(t, lv):
        for ax, leaf in enumerate(lv):
            if leaf.cls == group.cls:
                t = t * per_unit(group, factor.to(t.dtype), lv, ax, t.ndim)
        return t

    return fn


def _unit_sums(spec: SymmetrySpec, key: str, t: Tensor, group: Group, exps: dict) -> Tensor:
    """Per unit, ``sum e t`` over the entries of ``t`` on class axes of exponent ``e``."""
    out = torch.zeros(value_shape(spec, group), dtype=t.dtype)
    for block, lv in blocks_of(spec, key, t):
        for ax, leaf in enumerate(lv):
            e = exps.get(leaf.var, 0)
            if e and leaf.cls == group.cls:
                out = out + e * per_copy_sums(group, block, lv, ax)
    return out


def class_vars(spec: SymmetrySpec, key: str, group: Group) -> set[int]:
    """The leaf variables of ``key``'s axes that belong to ``group``'s class."""
    from wsym.group.spec import leaves

    return {leaf.var for t in spec.layout[key] for leaf in leaves(t) if leaf.cls == group.cls}


def _dtype(y: dict) -> torch.dtype:
    return next((v.dtype for v in y.values() if v.is_floating_point()), torch.float64)
