"""Quotient geometry of GL blocks ``(G, H)`` used through ``G H^T``: a functional core.

Everything takes plain tensors, batched over leading dims (one block per head):

* :mod:`~wsym.geometry.block` -- :class:`Pair`, the ``GL(h)`` action, vertical vectors;
* :mod:`~wsym.geometry.metrics` -- euclidean, invariant and mixed metrics, and the
  elementwise adaptive metric for plain parameters;
* :mod:`~wsym.geometry.horizontal` -- horizontal projection (exact Sylvester solve);
* :mod:`~wsym.geometry.gradient` -- Riemannian gradients;
* :mod:`~wsym.geometry.geodesic` -- Christoffel symbols and the second-order geodesic step;
* :mod:`~wsym.geometry.conserved` -- ``G^T G - H^T H``, conserved by gradient flow;
* :mod:`~wsym.geometry.reference` -- slow autograd / ODE / Kronecker references for tests.

The formulas are in ``docs/geometry.md`` and in each module's docstring.
"""

from wsym.geometry.block import DEFAULT_EPS, METRICS, Gram, Metric, Pair, act, vertical
from wsym.geometry.conserved import conserved
from wsym.geometry.geodesic import (
    christoffel,
    geodesic_step,
    geodesic_step_linearized,
    geodesic_step_vjp,
)
from wsym.geometry.gradient import adaptive_gradient, riemannian_gradient
from wsym.geometry.horizontal import horizontal, horizontal_lambda
from wsym.geometry.metrics import adaptive_inner, adaptive_norm, inner, norm

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
