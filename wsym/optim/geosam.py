r"""Geodesic SAM: the SAM ascent taken on the quotient by the model's GL symmetries.

The perturbation is one normalized Riemannian-gradient step of geodesic sharpness
(:mod:`wsym.sharpness`, da Silva et al. 2025): on each GL block ``(G, H)`` of the
spec (and each ReLU scaling group usable as a ``GL(1)`` block, see
:mod:`wsym.quotient`) the tangent is the horizontal Riemannian gradient in the
``invariant`` or ``mixed`` metric, and the block moves along the second-order
geodesic step :func:`wsym.geometry.geodesic_step`; every other entry uses the
elementwise adaptive metric :math:`\|\xi / |w|\|` and a straight step:

.. math::
    \xi = \rho\, \frac{\operatorname{grad} L}{\|\operatorname{grad} L\|_\theta}, \qquad
    \theta^+ = \gamma_\xi(1) \approx \theta + \xi - \tfrac12 \Gamma(\xi, \xi).

The Euclidean gradient with respect to the tangent coordinates is the pullback of
:math:`\nabla L(\theta)` through :math:`\xi \mapsto \gamma_\xi(1)` at
:math:`\xi = 0` (the quadratic term has no derivative there), taken with autograd.
The geometry is computed in float64. Since the metric is invariant, the step is
equivariant: a symmetric copy of the network is perturbed to the symmetric image
of :math:`\theta^+`.

The spec is detected with :func:`wsym.detect` from ``example_inputs`` when not given
(the closure's inputs are not visible to the optimizer).

Example:
    >>> import torch
    >>> from wsym.reference import MLP
    >>> _ = torch.manual_seed(0)
    >>> model, x = MLP(4, [8], 3), torch.randn(16, 4)
    >>> opt = GeoSAM(model, rho=0.05, lr=0.1, example_inputs=x)
    >>> y = torch.randint(0, 3, (16,))
    >>> def closure():
    ...     opt.zero_grad()
    ...     loss = torch.nn.functional.cross_entropy(model(x), y)
    ...     loss.backward()
    ...     return loss
    >>> before = float(opt.step(closure).detach())
    >>> float(closure().detach()) < before
    True
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from wsym.detect import spec_or_detect
from wsym.errors import WsymInputError
from wsym.optim.base import SharpnessAware
from wsym.perturbation import Geodesic
from wsym.spec import SymmetrySpec

GEO_METRICS = ("invariant", "mixed")


class GeoSAM(SharpnessAware):
    """SAM with the geodesic perturbation of the quotient geometry (module docstring).

    Args:
        model: the network (its trainable parameters are optimized; BatchNorm
            statistics are protected during the ascent pass).
        base_optimizer: optimizer class for the descent step.
        rho: radius in the quotient metric, > 0.
        spec: the model's symmetries; ``None`` detects them on ``example_inputs``.
        example_inputs: inputs for detection when ``spec`` is ``None``.
        metric: ``"mixed"`` (default) or ``"invariant"`` metric on GL blocks.
        **kwargs: passed to ``base_optimizer``.

    Raises:
        WsymInputError: the spec has no GL block (nor ReLU scaling usable as GL(1)).
    """

    def __init__(
        self,
        model: nn.Module,
        base_optimizer: type[torch.optim.Optimizer] = torch.optim.SGD,
        rho: float = 0.05,
        spec: SymmetrySpec | None = None,
        example_inputs: Any = None,
        metric: str = "mixed",
        **kwargs: Any,
    ):
        if not isinstance(model, nn.Module):
            raise WsymInputError("GeoSAM takes the model (an nn.Module), not its parameters")
        if metric not in GEO_METRICS:
            raise WsymInputError(f"unknown metric {metric!r}; use one of {', '.join(GEO_METRICS)}")
        super().__init__(model, base_optimizer, rho, **kwargs)
        self.spec = spec_or_detect(spec, model, example_inputs, "GeoSAM")
        self.metric = metric
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        if not self._geometry(self.params).blocks:
            raise WsymInputError(
                "GeoSAM needs GL groups (or ReLU scaling groups usable as GL(1) blocks) and "
                "the spec has none; use ASAM for elementwise symmetries or SAM"
            )

    def _geometry(self, params: list[Tensor]) -> Geodesic:
        table = {n: p.detach().double() for n, p in zip(self.names, params, strict=True)}
        return Geodesic(table, self.spec, self.metric)

    def perturbation(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        """Displacement ``gamma_xi(1) - theta`` of the normalized Riemannian-gradient step."""
        geom = self._geometry(params)
        with torch.enable_grad():
            xi = [x.requires_grad_(True) for x in geom.zero()]
            moved = geom.point(xi)
            value = sum(
                (moved[n] * g.double()).sum() for n, g in zip(self.names, grads, strict=True)
            )
            pulled = torch.autograd.grad(value, xi, allow_unused=True)
        pulled = [torch.zeros_like(x) if g is None else g for x, g in zip(xi, pulled, strict=True)]
        direction = geom.gradient(pulled)
        size = float(geom.gradient_norm(pulled, direction))
        if not size > 0:
            return [torch.zeros_like(p) for p in params]
        step = [self.rho / size * d for d in direction]
        with torch.no_grad():
            target = geom.point(step)
        return [
            (target[n] - geom.params[n]).to(p.dtype)
            for n, p in zip(self.names, params, strict=True)
        ]
