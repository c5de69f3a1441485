"""Quotient geometry of GL blocks ``(G, H)`` used through ``G H^T``: a functional core.

Everything takes plain tensors, batched over leading dims (one block per head):

* :mod:`~wsym.sharpness.geometry.block` -- :class:`Pair`, the ``GL(h)`` action, vertical vectors;
* :mod:`~wsym.sharpness.geometry.metrics` -- euclidean, invariant and mixed metrics, and the
  elementwise adaptive metric for plain parameters;
* :mod:`~wsym.sharpness.geometry.horizontal` -- horizontal projection (exact Sylvester solve);
* :mod:`~wsym.sharpness.geometry.gradient` -- Riemannian gradients;
* :mod:`~wsym.sharpness.geometry.geodesic` -- Christoffel symbols, second-order geodesic step;
* :mod:`~wsym.sharpness.geometry.conserved` -- ``G^T G - H^T H``, conserved by gradient flow;
* :mod:`~wsym.testing.oracles.geometry` -- slow autograd / ODE / Kronecker references for tests.

The formulas are in ``docs/geometry.md`` and in each module's docstring.
"""

from wsym.sharpness.geometry.block import DEFAULT_EPS, METRICS, Gram, Metric, Pair, act, vertical
from wsym.sharpness.geometry.conserved import conserved
from wsym.sharpness.geometry.geodesic import (
    christoffel,
    geodesic_step,
    geodesic_step_linearized,
    geodesic_step_vjp,
)
from wsym.sharpness.geometry.gradient import adaptive_gradient, riemannian_gradient
from wsym.sharpness.geometry.horizontal import horizontal, horizontal_lambda
from wsym.sharpness.geometry.metrics import adaptive_inner, adaptive_norm, inner, norm

__all__ = [
    "DEFAULT_EPS",
    "METRICS",
    "Gram",
    "Metric",
    "Pair",
    "act",
    "adaptive_gradient",
    "adaptive_inner",
    "adaptive_norm",
    "christoffel",
    "conserved",
    "geodesic_step",
    "geodesic_step_linearized",
    "geodesic_step_vjp",
    "horizontal",
    "horizontal_lambda",
    "inner",
    "norm",
    "riemannian_gradient",
    "vertical",
]
