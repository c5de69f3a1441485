"""Conserved quantities of gradient flow, one per continuous group (Noether's theorem).

If the loss is invariant under a continuous group, its gradient is orthogonal
to every vertical vector: ``<grad L, J_a theta> = 0`` for every coefficient
``a`` (:mod:`wsym.group.generators`), i.e. ``J^T grad L = 0``. For the linear
actions here the *moment map*

    Q(theta) = J_theta^T theta        (so that <a, Q> = <theta, J_a theta>)

is then constant along gradient flow ``theta' = -grad L``: ``Q'`` is
``J^T theta'`` plus its transpose (``2 J^T theta'`` for scalings, ``J^T theta'``
for translations), and ``J^T theta' = -J^T grad L = 0`` by invariance. Per kind
(parameters only: buffers are not trained):

=============  ===================================================================
kind           ``Q``
=============  ===================================================================
scaling        per unit ``sum_entries e w^2`` (``||w_in||^2 + b^2 - ||w_out||^2``)
norm_scaling   per unit ``sum e w^2`` of the weights feeding the normalization
               (its scale invariance in training mode; the eval-mode correction
               of the BatchNorm weight reads a buffer and is left out)
gl             per index ``sum_parity0 G^T G - sum_parity1 H^T H`` (``h x h``)
translation    the parameters' component along the translations (``J^T theta``:
               ``sum b`` for a uniform shift, ``mask * b`` otherwise); linear
=============  ===================================================================

Orthogonal groups are isometries: their ``Q`` (a skew part of a symmetric
matrix) vanishes identically, so they are left out. Overlapping groups each
keep their own quantity.

Under gradient descent with step ``lr`` the quadratic quantities drift by
``lr^2 Q(grad L)`` per step, exactly (``O(lr^2)``); with weight decay ``lam``
(``theta -> (1 - lr lam) theta - lr grad L``) a quadratic ``Q`` is multiplied by
``(1 - lr lam)^2`` per step and a linear one (translation) by ``1 - lr lam``,
up to that drift (:func:`decay`).

Example:
    >>> import torch, wsym
    >>> from wsym.models.networks import MLP
    >>> model = MLP(3, [4], 2).double()
    >>> spec = wsym.detect(model, torch.randn(2, 3, dtype=torch.float64))
    >>> sd = model.state_dict()
    >>> q = spec.conserved(sd)
    >>> [(spec.groups[i].kind, tuple(v.shape)) for i, v in q.items()]
    [('scaling', (4,))]
    >>> w1, b1, w2 = sd["0.weight"], sd["0.bias"], sd["2.weight"]
    >>> ref = (w1**2).sum(1) + b1**2 - (w2**2).sum(0)
    >>> [(i, value)] = q.items()
    >>> bool(torch.allclose(value, ref))
    True
"""

from __future__ import annotations

from torch import Tensor

from wsym.group.kinds import Scaling, kind_of
from wsym.group.spec import Group, SymmetrySpec

_SCALING = Scaling()


def conserved(spec: SymmetrySpec, state: dict) -> dict[int, Tensor]:
    """``{group index: Q}`` for every continuous group with a quantity (see the module doc).

    Shapes: scaling / norm_scaling ``(n,)``; gl ``(*index, h, h)``; translation
    ``()`` (uniform) or the parameter's shape.
    """
    skip = set(spec.buffers) | {alias for alias, _ in spec.aliases}
    params = {k: v for k, v in state.items() if k not in skip and v.is_floating_point()}
    out = {}
    for i, group in enumerate(spec.groups):
        kind = kind_of(group)
        if not kind.continuous or kind.self_dual:  # rotations: Q vanishes identically
            continue
        if kind.diagonal:  # norm_scaling: its scaling part only (no buffer-dependent term)
            out[i] = _SCALING.generator_adjoint(spec, group, params, params)
        else:
            out[i] = kind.generator_adjoint(spec, group, params, params)
    return out


def degree(group: Group) -> int:
    """2 for the quadratic quantities, 1 for the linear one (translations)."""
    return 1 if kind_of(group).additive else 2


def decay(group: Group, lr: float, weight_decay: float) -> float:
    """The factor weight decay multiplies ``group``'s quantity by per step, to leading order."""
    return (1.0 - lr * weight_decay) ** degree(group)
