r"""Sharpness-aware minimization: the two-pass step shared by the whole SAM family.

Every method here minimizes :math:`\max_{\|\epsilon\|_\theta \le \rho} L(\theta + \epsilon)`
to first order (Foret et al. 2021). One step, with the gradient :math:`g = \nabla L(\theta)`
from the first call of the closure:

1. ascent: :math:`\theta^+ = \theta + \epsilon(\theta, g)`, the perturbation of radius
   :math:`\rho` in the method's own metric (:meth:`SharpnessAware.perturbation`);
2. the closure again, at :math:`\theta^+`: :math:`g^+ = \nabla L(\theta^+)`;
3. restore :math:`\theta` exactly (a saved copy, not a subtraction);
4. descent: the base optimizer steps from :math:`\theta` with the gradient
   :math:`T g^+`, where :math:`T` is the identity except for methods that transport
   the update (:meth:`SharpnessAware.transport`; LLQR+SAM uses its preconditioner).

A step costs two gradient evaluations. Subclasses define only the perturbation (and
optionally the transport).

BatchNorm: when the optimizer is built from a module (``SAM(model, ...)``) rather
than from ``model.parameters()``, every buffer of the module (BatchNorm running
means, variances and batch counters) is saved before the ascent pass and restored
after it, so the running statistics are updated once per step, by the pass at
:math:`\theta`. Built from parameters, the optimizer cannot see the buffers; pass
the module when it has BatchNorm.

Shapes:
    Perturbations are lists of tensors shaped like the parameters, in
    :attr:`SharpnessAware.params` order (all parameter groups, concatenated).

Example:
    >>> import torch
    >>> from wsym.optim import SAM
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Linear(3, 1)
    >>> x, y = torch.randn(16, 3), torch.randn(16, 1)
    >>> opt = SAM(model, base_optimizer=torch.optim.SGD, rho=0.05, lr=0.1)
    >>> def closure():
    ...     opt.zero_grad()
    ...     loss = ((model(x) - y) ** 2).mean()
    ...     loss.backward()
    ...     return loss
    >>> first = float(opt.step(closure).detach())
    >>> float(closure().detach()) < first
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from wsym.errors import WsymInputError

Closure = Callable[[], Tensor]


def check_positive(name: str, value: Any, example: str) -> None:
    """One-line :class:`WsymInputError` unless ``value`` is a finite number > 0."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise WsymInputError(
            f"{name} must be a positive number, got {value!r}; pass e.g. {example}"
        )


@contextmanager
def frozen_buffers(module: nn.Module | None):
    """Restore every buffer of ``module`` (BatchNorm running statistics) on exit."""
    if module is None:
        yield
        return
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, old in saved:
                b.copy_(old)


class SharpnessAware(torch.optim.Optimizer):
    r"""Base class: two-pass SAM step around any base optimizer.

    Args:
        params: an ``nn.Module`` (its trainable parameters; BatchNorm statistics are
            then protected, see the module docstring) or an iterable of parameters
            or parameter groups.
        base_optimizer: the class of the optimizer that takes the descent step
            (``torch.optim.SGD``, ``torch.optim.Adam``, ...).
        rho: radius of the perturbation, > 0, in the method's metric.
        **kwargs: passed to ``base_optimizer`` (``lr``, ``momentum``, ...).

    Subclasses implement :meth:`perturbation` and may override :meth:`transport`.
    """

    def __init__(
        self,
        params: nn.Module | Iterable,
        base_optimizer: type[torch.optim.Optimizer] = torch.optim.SGD,
        rho: float = 0.05,
        **kwargs: Any,
    ):
        check_positive("rho", rho, "rho=0.05")
        if "lr" in kwargs:
            check_positive("lr", kwargs["lr"], "lr=0.1")
        self.module = params if isinstance(params, nn.Module) else None
        if self.module is not None:
            params = [p for p in self.module.parameters() if p.requires_grad]
        super().__init__(params, dict(rho=rho, **kwargs))
        self.rho = float(rho)
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)

    @property
    def params(self) -> list[Tensor]:
        """All parameters, in group order."""
        return [p for group in self.param_groups for p in group["params"]]

    def perturbation(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        r"""The ascent displacement :math:`\epsilon` (radius :attr:`rho` in the method's metric).

        Args:
            params: the parameters :math:`\theta` (do not modify).
            grads: :math:`\nabla L(\theta)`, zeros where a parameter got no gradient.

        Returns:
            One tensor per parameter, shaped like it.
        """
        raise NotImplementedError

    def transport(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        """The gradient handed to the base optimizer; the identity by default."""
        return grads

    @torch.no_grad()
    def step(self, closure: Closure | None = None) -> Tensor:  # type: ignore[override]
        r"""One sharpness-aware step; ``closure`` zeroes grads, computes the loss, backwards.

        Returns:
            The loss at :math:`\theta` (from the first call of the closure).
        """
        if closure is None:
            raise WsymInputError(
                f"{type(self).__name__}.step needs a closure (it evaluates the gradient "
                "twice); pass step(closure) with a closure that zeroes grads, computes the "
                "loss, calls backward and returns the loss"
            )
        with torch.enable_grad():
            loss = closure()
        params = self.params
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
        eps = self.perturbation(params, grads)
        saved = [p.detach().clone() for p in params]
        for p, e in zip(params, eps, strict=True):
            p.add_(e.to(p.dtype))
        with frozen_buffers(self.module), torch.enable_grad():
            closure()
        for p, old in zip(params, saved, strict=True):
            p.copy_(old)
        used = [p.grad is not None for p in params]
        plus = [p.grad if u else torch.zeros_like(p) for p, u in zip(params, used, strict=True)]
        for p, g, u in zip(params, self.transport(params, plus), used, strict=True):
            if u:
                p.grad = g.to(p.dtype)
        self.base_optimizer.step()
        return loss


def global_norm(tensors: Iterable[Tensor]) -> Tensor:
    r""":math:`\sqrt{\sum_i \|t_i\|^2}` over a list of tensors (0-dim, float64)."""
    return torch.sqrt(sum((t.double() ** 2).sum() for t in tensors))
