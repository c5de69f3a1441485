r"""SAM, ASAM and Fisher-SAM: perturbations of radius :math:`\rho` in three metrics.

With :math:`g = \nabla L(\theta)` and a diagonal metric :math:`M` (so
:math:`\|\epsilon\|_M^2 = \epsilon^\top M \epsilon`), the first-order maximizer of
:math:`L(\theta + \epsilon)` over :math:`\|\epsilon\|_M \le \rho` is

.. math::
    \epsilon = \rho\, \frac{M^{-1} g}{\sqrt{g^\top M^{-1} g}}, \qquad \|\epsilon\|_M = \rho.

=============  ==========================================  =================================
method         metric :math:`M`                             reference
=============  ==========================================  =================================
SAM            :math:`I`                                    Foret et al. 2021
ASAM           :math:`T^{-2}`, :math:`T = |w| + \eta`       Kwon et al. 2021 (elementwise)
               on weights, :math:`T = 1` on biases (1-d)
Fisher-SAM     :math:`F = 1 + \eta\, g^2` (diagonal,        Kim et al. 2022
               empirical Fisher of the batch)
=============  ==========================================  =================================

ASAM's metric is invariant under the elementwise rescalings that ReLU networks
admit (up to :math:`\eta`); SAM's is not.

Example:
    >>> import torch
    >>> w = torch.nn.Parameter(torch.tensor([[3.0, -1.0]]))  # a weight matrix
    >>> opt = ASAM([w], rho=0.5, eta=0.0, lr=0.1)
    >>> eps = opt.perturbation([w], [torch.tensor([[1.0, 1.0]])])
    >>> round(float(((eps[0] / w.detach().abs()) ** 2).sum().sqrt()), 6)  # |w|^-2 metric
    0.5
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from wsym.errors import WsymInputError
from wsym.optim.base import SharpnessAware


def _scaled(directions: list[Tensor], grads: list[Tensor], rho: float) -> list[Tensor]:
    """``rho * d / sqrt(<g, d>)``: the step of radius rho in the metric with ``d = M^-1 g``."""
    dot = sum((d.double() * g.double()).sum() for d, g in zip(directions, grads, strict=True))
    scale = rho / float(torch.sqrt(dot)) if float(dot) > 0 else 0.0
    return [scale * d for d in directions]


class SAM(SharpnessAware):
    r"""Sharpness-aware minimization: :math:`\epsilon = \rho\, g / \|g\|_2`.

    Example:
        >>> import torch
        >>> w = torch.nn.Parameter(torch.ones(2))
        >>> opt = SAM([w], rho=0.1, lr=0.1)
        >>> from wsym.optim.base import global_norm
        >>> round(float(global_norm(opt.perturbation([w], [torch.tensor([3.0, 4.0])]))), 6)
        0.1
    """

    def perturbation(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        r""":math:`\rho g / \|g\|`."""
        return _scaled(list(grads), grads, self.rho)


class ASAM(SharpnessAware):
    r"""Adaptive SAM: :math:`\epsilon = \rho\, T^2 g / \|T g\|`, :math:`T = |w| + \eta`.

    Args:
        params: module or parameters (see :class:`~wsym.optim.base.SharpnessAware`).
        base_optimizer: optimizer class for the descent step.
        rho: radius in the adaptive metric :math:`\|T^{-1}\epsilon\|_2` (ASAM uses ~0.5-2).
        eta: offset keeping zero weights perturbable, >= 0 (0.01 in the paper).
        **kwargs: passed to ``base_optimizer``.
    """

    def __init__(
        self,
        params: nn.Module | Iterable,
        base_optimizer: type[torch.optim.Optimizer] = torch.optim.SGD,
        rho: float = 0.5,
        eta: float = 0.01,
        **kwargs: Any,
    ):
        self.eta = _check_eta(eta, "0.01")
        super().__init__(params, base_optimizer, rho, **kwargs)

    def scale(self, w: Tensor) -> Tensor:
        r""":math:`T = |w| + \eta` for weights (ndim >= 2), ones for biases and gains."""
        return w.detach().abs() + self.eta if w.ndim >= 2 else torch.ones_like(w)

    def perturbation(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        r""":math:`\rho T^2 g / \|T g\|`."""
        return _scaled(
            [self.scale(w) ** 2 * g for w, g in zip(params, grads, strict=True)], grads, self.rho
        )


class FisherSAM(SharpnessAware):
    r"""Fisher SAM: :math:`\epsilon = \rho F^{-1} g / \|g\|_{F^{-1}}` with :math:`F = 1 + \eta g^2`.

    :math:`F` is the diagonal empirical Fisher of the current batch, :math:`g^2`,
    damped by the identity (Kim et al. 2022).

    Args:
        params: module or parameters (see :class:`~wsym.optim.base.SharpnessAware`).
        base_optimizer: optimizer class for the descent step.
        rho: radius in the Fisher metric :math:`\sqrt{\epsilon^\top F \epsilon}`.
        eta: weight of the Fisher against the identity, >= 0 (1.0 default).
        **kwargs: passed to ``base_optimizer``.
    """

    def __init__(
        self,
        params: nn.Module | Iterable,
        base_optimizer: type[torch.optim.Optimizer] = torch.optim.SGD,
        rho: float = 0.05,
        eta: float = 1.0,
        **kwargs: Any,
    ):
        self.eta = _check_eta(eta, "1.0")
        super().__init__(params, base_optimizer, rho, **kwargs)

    def metric(self, grads: list[Tensor]) -> list[Tensor]:
        r"""The diagonal :math:`F = 1 + \eta g^2`, one tensor per parameter."""
        return [1.0 + self.eta * g * g for g in grads]

    def perturbation(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        r""":math:`\rho F^{-1} g / \sqrt{g^\top F^{-1} g}`."""
        fisher = self.metric(grads)
        return _scaled([g / f for g, f in zip(grads, fisher, strict=True)], grads, self.rho)


def _check_eta(eta: Any, example: str) -> float:
    if not isinstance(eta, int | float) or eta < 0:
        raise WsymInputError(f"eta must be a number >= 0, got {eta!r}; pass e.g. eta={example}")
    return float(eta)
