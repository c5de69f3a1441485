"""Infinitesimal action of every continuous group: the vertical vectors at a point.

For a continuous group with coefficient ``a`` (shape :attr:`Generators.shape`),
the one-parameter subgroup ``t -> exp(t a)`` moves a state theta along its
orbit; the generator is

    J a = d/dt (exp(t a) . theta) at t = 0,

a tangent vector on the tensors the group moves, and ``J^T`` is its Euclidean
adjoint, ``<J a, y> = <a, J^T y>``. The vertical space at theta is the span of
``J a`` over every continuous group and coefficient. Conventions (closed forms
in :mod:`wsym.group.kinds`):

==================  ====================  ===========================================
kind                ``exp(t a)``          ``J a``
==================  ====================  ===========================================
scaling             ``s = exp(t a)``      ``e a_unit w`` per entry of exponent ``e``
norm_scaling        ``s = exp(t a)``      as scaling, and ``-u a eps/(v+eps) gamma``
gl                  ``matrix_exp(t a)``   ``x a`` (parity 0), ``-x a^T`` (parity 1)
orthogonal          ``matrix_exp(t A)``   as gl with ``A = (a - a^T)/2``
translation         ``t a``               ``mask * a`` (``a`` everywhere if uniform)
==================  ====================  ===========================================

For a GL block ``(G, H)`` (parity-0 rows ``G``, parity-1 rows ``H``) this is
``(G a, -H a^T)``: Hide & Seek's vertical space ``{(-G Omega, H Omega^T)}`` with
``a = -Omega``.

``J a`` covers every tensor the group moves, buffers included (a norm_scaling
group moves running statistics and corrects a BatchNorm weight by its running
variance, so ``state`` must hold the buffers); drop the buffer keys
(``spec.buffers``) for a vertical vector in parameter space. ``J^T y`` reads
only the keys present in ``y``.

Example:
    >>> import torch, wsym
    >>> from wsym.models.networks import MLP
    >>> model = MLP(3, [4], 2).double()
    >>> spec = wsym.detect(model, torch.randn(2, 3, dtype=torch.float64))
    >>> sd = model.state_dict()
    >>> gens = continuous_groups(spec)
    >>> [(g.group.kind, g.shape) for g in gens]
    [('scaling', (4,))]
    >>> a = torch.randn(gens[0].shape, dtype=torch.float64)
    >>> y = {k: torch.randn_like(v) for k, v in gens[0].apply(sd, a).items()}
    >>> lhs = sum(float((v * y[k]).sum()) for k, v in gens[0].apply(sd, a).items())
    >>> abs(lhs - float((a * gens[0].adjoint(sd, y)).sum())) < 1e-12
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from wsym.group.kinds import Kind, kind_of
from wsym.group.spec import Group, SymmetrySpec


@dataclass(frozen=True)
class Generators:
    """The infinitesimal action of one continuous group of a spec.

    Attributes:
        spec: the symmetry spec.
        index: the group's position in ``spec.groups``.
        group: the group.
        kind: its :class:`~wsym.group.kinds.Kind`.
    """

    spec: SymmetrySpec
    index: int
    group: Group
    kind: Kind

    @property
    def keys(self) -> tuple[str, ...]:
        """The state-dict keys ``J a`` has (buffers included; see the module doc)."""
        g = self.group
        moved = [*g.params, *(w for w, _, _, _ in g.corrections)]
        moved += [p for p, _ in self.kind.extra_axes(g)]
        return tuple(dict.fromkeys(moved))

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of a coefficient ``a``."""
        return self.kind.coefficient_shape(self.spec, self.group)

    def apply(self, state: dict, a: Tensor) -> dict[str, Tensor]:
        """``J a`` at ``state``: ``{key: tangent}`` on every tensor the group moves."""
        return self.kind.generator(self.spec, self.group, state, a)

    def adjoint(self, state: dict, y: dict) -> Tensor:
        """``J^T y`` at ``state`` (shape :attr:`shape`; skew for orthogonal groups)."""
        return self.kind.generator_adjoint(self.spec, self.group, state, y)

    def exp(self, a: Tensor):
        """The group value at ``t = 1`` of the subgroup of ``a``."""
        return self.kind.exp(self.group, a)


def continuous_groups(spec: SymmetrySpec, kinds=None) -> list[Generators]:
    """One :class:`Generators` per continuous group of ``spec`` (in spec order).

    Args:
        spec: the symmetry spec.
        kinds: only these kinds (default: every continuous kind).
    """
    return [
        Generators(spec, i, g, kind_of(g))
        for i, g in enumerate(spec.groups)
        if kind_of(g).continuous and (kinds is None or g.kind in kinds)
    ]


def vertical(spec: SymmetrySpec, state: dict, coefficients: dict[int, Tensor]) -> dict:
    """``sum_i J_i a_i``: one vertical vector from coefficients ``{group index: a_i}``."""
    out: dict[str, Tensor] = {}
    for i, a in coefficients.items():
        group = spec.groups[i]
        for key, v in kind_of(group).generator(spec, group, state, a).items():
            out[key] = out[key] + v if key in out else v
    return out


def vertical_adjoint(spec: SymmetrySpec, state: dict, y: dict) -> dict[int, Tensor]:
    """``{group index: J_i^T y}`` over every continuous group (adjoint of :func:`vertical`)."""
    return {g.index: g.adjoint(state, y) for g in continuous_groups(spec)}
