r"""LLQR+SAM: a SAM perturbation and an update, both in a slowly refreshed metric :math:`U^{-1}`.

Two time scales (Dufort-Labbé et al. 2026, "Navigating Potholes with Geometry-Aware
Sharpness Minimization"; see ``LLQR.md``):

* slow: the structured inverse preconditioner :math:`U` (diagonal or K-FAC, see
  :mod:`wsym.optim.precondition`) is refreshed every ``K`` steps as a moving average;
* fast: every step, with :math:`g = \nabla L(\theta)`,

.. math::
    \theta^+ = \theta + \rho\, \frac{U g}{\|g\|_U}, \quad \|g\|_U = \sqrt{g^\top U g},
    \qquad \theta \leftarrow \theta - \eta\, U \nabla L(\theta^+)

(the transported gradient :math:`U \nabla L(\theta^+)` goes through the base
optimizer). The perturbation has norm :math:`\rho` in the metric
:math:`P = U^{-1}`: :math:`\epsilon^\top U^{-1} \epsilon = \rho^2`.
``normalize="euclidean"`` divides by :math:`\|U g\|_2` instead, as the authors'
code does in practice ("less principled but more stable"); the perturbation then
has Euclidean norm :math:`\rho`.

The Fisher for the refresh is estimated on the inputs of the first forward pass of
the closure at a refresh step (captured by a forward pre-hook on the model), with
labels sampled from the model, so the closure interface is unchanged; the refresh
happens after that pass, before the perturbation. Classifiers only (logits ``(N, C)``,
positional inputs), unless a :class:`~wsym.optim.precondition.FixedDiagonal` is given.

On a two-scale quadratic with :math:`U = \bar H^{-1}`, SAM's late-time envelope
is of order :math:`\rho` in every direction while LLQR+SAM's, in sharp pothole
directions, scales as :math:`\rho \bar\lambda^{-1/2}` (tests/test_two_scale.py).

Example:
    >>> import torch
    >>> from wsym.reference import MLP
    >>> _ = torch.manual_seed(0)
    >>> model, x, y = MLP(4, [8], 3), torch.randn(32, 4), torch.randint(0, 3, (32,))
    >>> opt = LLQRSAM(model, rho=0.05, lr=0.1, refresh=10, preconditioner="kfac")
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

from wsym.errors import WsymInputError
from wsym.optim.base import SharpnessAware
from wsym.optim.precondition import PRECONDITIONERS, Preconditioner

NORMALIZATIONS = ("metric", "euclidean")


class LLQRSAM(SharpnessAware):
    r"""LLQR+SAM (module docstring).

    Args:
        model: the network (BatchNorm statistics are protected during the ascent pass).
        base_optimizer: optimizer class that receives :math:`U \nabla L(\theta^+)`.
        rho: perturbation radius in the metric :math:`U^{-1}` (or Euclidean), > 0.
        preconditioner: ``"diagonal"``, ``"kfac"``, or a
            :class:`~wsym.optim.precondition.Preconditioner` instance.
        refresh: ``K``, steps between refreshes of :math:`U` (>= 1; the first step refreshes).
        beta: moving-average factor of the refresh, in [0, 1).
        damping: Fisher damping relative to its mean curvature, > 0.
        normalize: ``"metric"`` (:math:`\sqrt{g^\top U g}`) or ``"euclidean"`` (:math:`\|Ug\|`).
        **kwargs: passed to ``base_optimizer`` (``lr``, ``momentum``, ...).
    """

    def __init__(
        self,
        model: nn.Module,
        base_optimizer: type[torch.optim.Optimizer] = torch.optim.SGD,
        rho: float = 0.05,
        preconditioner: str | Preconditioner = "diagonal",
        refresh: int = 100,
        beta: float = 0.95,
        damping: float = 0.1,
        normalize: str = "metric",
        **kwargs: Any,
    ):
        if not isinstance(model, nn.Module):
            raise WsymInputError("LLQRSAM takes the model (an nn.Module), not its parameters")
        if not isinstance(refresh, int) or isinstance(refresh, bool) or refresh < 1:
            raise WsymInputError(
                f"refresh (K) must be an integer >= 1, got {refresh!r}; pass e.g. refresh=100"
            )
        if normalize not in NORMALIZATIONS:
            raise WsymInputError(
                f"unknown normalize {normalize!r}; use one of {', '.join(NORMALIZATIONS)}"
            )
        if isinstance(preconditioner, str):
            if preconditioner not in PRECONDITIONERS:
                raise WsymInputError(
                    f"unknown preconditioner {preconditioner!r}; "
                    f"use one of {', '.join(PRECONDITIONERS)}"
                )
            preconditioner = PRECONDITIONERS[preconditioner](beta=beta, damping=damping)
        super().__init__(model, base_optimizer, rho, **kwargs)
        self.preconditioner, self.refresh, self.normalize = preconditioner, refresh, normalize
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.steps = 0
        self._inputs: Any = None
        model.register_forward_pre_hook(self._capture)

    def _capture(self, module: nn.Module, args: tuple) -> None:
        self._inputs = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)

    def _table(self, tensors: list[Tensor]) -> dict[str, Tensor]:
        return dict(zip(self.names, tensors, strict=True))

    def precondition(self, tensors: list[Tensor]) -> list[Tensor]:
        """:math:`U v` for a list shaped like the parameters."""
        out = self.preconditioner.apply(self._table(tensors))
        return [out[n] for n in self.names]

    def perturbation(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        r"""Refresh :math:`U` when due, then :math:`\rho U g / \|g\|_U` (or ``/ \|Ug\|``)."""
        if self.steps % self.refresh == 0:
            inputs = (
                self._inputs if self._inputs is None or len(self._inputs) != 1 else self._inputs[0]
            )
            table = {n: p.detach() for n, p in zip(self.names, params, strict=True)}
            with torch.enable_grad():
                self.preconditioner.estimate(self.module, table, inputs)
        self.steps += 1
        ug = self.precondition(grads)
        if self.normalize == "metric":
            size = sum((u.double() * g.double()).sum() for u, g in zip(ug, grads, strict=True))
        else:
            size = sum((u.double() ** 2).sum() for u in ug)
        size = float(size) ** 0.5
        return [self.rho / size * u if size > 0 else torch.zeros_like(u) for u in ug]

    def transport(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        r""":math:`U \nabla L(\theta^+)`."""
        return self.precondition(grads)
