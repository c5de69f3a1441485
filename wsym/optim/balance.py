r"""The balancing element of :func:`wsym.sharpness.gauge.balanced`, as GeoSAM needs it.

:func:`~wsym.sharpness.gauge.balanced` returns the balanced point
:math:`\hat\theta = k \cdot \theta` only; an optimizer perturbing at :math:`\hat\theta`
must map the perturbation back, so it needs how :math:`k` acts. :math:`k` is a
translation to the canonical representative followed by a diagonal element
:math:`s^\star` (scaling / norm_scaling), so it acts on the parameters as
:math:`x \mapsto f \odot x + c`: :func:`balancing` returns :math:`\hat\theta` and the
elementwise factor :math:`f`, got by acting :math:`s^\star` on a state of ones.

Example:
    >>> import torch, wsym
    >>> from wsym.models.networks import MLP
    >>> model = MLP(3, [4, 4], 2).double()
    >>> spec = wsym.detect(model, torch.randn(5, 3, dtype=torch.float64))
    >>> params = dict(model.named_parameters())
    >>> hat, f = balancing(spec, params)
    >>> all(torch.allclose(hat[n], f[n] * params[n]) for n in params)  # no translation here
    True
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsym.group.elements import act
from wsym.group.spec import SymmetrySpec
from wsym.sharpness import gauge


def balancing(
    spec: SymmetrySpec, params: dict[str, Tensor]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``(theta_hat, f)``: the balanced parameters (float64) and ``d theta_hat / d theta``.

    Args:
        spec: the symmetry spec.
        params: ``{name: tensor}``, the parameters that are perturbed.

    Returns:
        Both dicts keyed like ``params``; ``f`` is all ones where nothing is balanced.
    """
    state, k = gauge.balancing_element(spec, params, names=list(params))
    ones = {n: torch.ones_like(t) for n, t in state.items()}
    if not k.components:
        return state, ones
    full = {
        name: torch.ones(tuple(t.size for t in dims), dtype=torch.float64)
        for name, dims in spec.layouts
    }
    full.update(ones)
    factor = act(spec, k, full)
    moved = act(spec, k, {**full, **state})
    return {n: moved[n] for n in state}, {n: factor[n] for n in state}
