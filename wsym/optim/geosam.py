r"""Geodesic SAM: the SAM ascent taken on the quotient by the model's whole continuous group.

The perturbation is one normalized Riemannian-gradient step of geodesic sharpness
(:mod:`wsym.sharpness`, da Silva et al. 2025) in the geometry of
:class:`wsym.sharpness.perturbation.Geodesic`: tangents horizontal to *every* continuous group of
the spec (scaling, norm_scaling without running statistics, gl, orthogonal,
translation), the ``invariant`` or ``mixed`` metric and the second-order geodesic step
on the GL, orthogonal and GL(1) blocks, the elementwise adaptive metric
:math:`\|\xi / |w|\|` and a straight step elsewhere:

.. math::
    \hat\xi = \rho\, \frac{\operatorname{grad} L(\hat\theta)}
                         {\|\operatorname{grad} L(\hat\theta)\|_{\hat\theta}}, \qquad
    \hat\theta^+ = \gamma_{\hat\xi}(1) \approx \hat\theta + \hat\xi
                   - \tfrac12 \Gamma(\hat\xi, \hat\xi).

The step is taken at the *balanced point* :math:`\hat\theta = k \cdot \theta` of
:func:`wsym.sharpness.gauge.balanced` (:math:`k` a diagonal element, translations at
their canonical representative), where the metric is invariant to the whole group, and
mapped back: :math:`k` acts on the parameters as :math:`x \mapsto f \odot x + c`, so
:math:`\nabla L(\hat\theta) = \nabla L(\theta) / f` and the perturbed point is
:math:`k^{-1} \cdot \hat\theta^+ = \theta + \epsilon` with
:math:`\epsilon = (\hat\theta^+ - \hat\theta) / f`. No extra gradient is evaluated.

**Invariance.** The step is equivariant to every element :math:`g` of the spec's
group (continuous and discrete kinds together): perturbing :math:`g \cdot \theta`
gives :math:`g \cdot (\theta + \epsilon)` (float64, elements with scales in
1e-2..1e2: ~1e-14 relative on a ReLU MLP, ~1e-8 on a transformer, where the Gram
solve's tolerance shows), so the descent pass sees the same function whichever point
of the orbit the weights sit at. Entries that are exactly zero in a whole tensor (a
LayerNorm bias at initialization) fall outside this: the adaptive metric's shift on
them is absolute. The BatchNorm ``norm_scaling`` groups (running
statistics) are outside the quotient, as in :mod:`wsym.sharpness`; the adaptive metric
on their entries is invariant to them anyway.

A spec with no continuous group has no quotient: GeoSAM then warns once
(:class:`~wsym.errors.SymmetryWarning`) and takes the adaptive perturbation
(:class:`wsym.sharpness.perturbation.Adaptive`, the metric :math:`\|\epsilon / |w|\|`, which is
still equivariant to permutations and signs). The geometry is computed in float64.

The spec is detected with :func:`wsym.detect` from ``example_inputs`` when not given
(the closure's inputs are not visible to the optimizer).

Example:
    >>> import torch
    >>> from wsym.models.networks import MLP
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

import warnings
from typing import Any

import torch
from torch import Tensor, nn

from wsym.detect import spec_or_detect
from wsym.errors import SymmetryWarning, WsymInputError
from wsym.group.kinds import kind_of
from wsym.group.spec import SymmetrySpec
from wsym.optim.balance import balancing
from wsym.optim.base import SharpnessAware
from wsym.sharpness.perturbation import Adaptive, Geodesic, Perturbation

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

    Warns:
        SymmetryWarning: the spec has no continuous group; the perturbation is the
            adaptive one.
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
        self.quotient = any(kind_of(g).continuous for g in self.spec.groups)
        if not self.quotient:
            warnings.warn(
                "GeoSAM: the spec has no continuous group, so there is no quotient; "
                "the perturbation is the adaptive one (ASAM's metric |eps / |w||)",
                SymmetryWarning,
                stacklevel=2,
            )

    def perturbation(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        """``epsilon = (gamma_xi(1) - theta_hat) / f``: the balanced step, mapped back."""
        table = {n: p.detach().double() for n, p in zip(self.names, params, strict=True)}
        grad = {n: g.detach().double() for n, g in zip(self.names, grads, strict=True)}
        if self.quotient:
            table, factor = balancing(self.spec, table)
            grad = {n: g / factor[n] if n in factor else g for n, g in grad.items()}
            geom: Perturbation = Geodesic(table, self.spec, self.metric)
        else:
            factor, geom = {}, Adaptive(table)
        step = _ascent(geom, [grad[n] for n in self.names], self.rho)
        if step is None:
            return [torch.zeros_like(p) for p in params]
        with torch.no_grad():
            target = geom.point(step)
        out = []
        for n, p in zip(self.names, params, strict=True):
            eps = target[n] - table[n]
            out.append((eps / factor[n] if n in factor else eps).to(p.dtype))
        return out


def _ascent(geom: Perturbation, grads: list[Tensor], rho: float) -> list[Tensor] | None:
    """``rho grad / |grad|`` in the tangent coordinates of ``geom`` (None at a zero gradient).

    The Euclidean gradient with respect to the tangent is the pullback of ``grads``
    through ``xi -> gamma_xi(1)`` at ``xi = 0`` (the quadratic term has no derivative there).
    """
    with torch.no_grad():
        _, pullback = geom.linearize(geom.zero())
        pulled = pullback(grads)
    direction = geom.gradient(pulled)
    size = float(geom.gradient_norm(pulled, direction))
    if not size > 0:
        return None
    return [rho / size * d for d in direction]
