r"""LLQR and LLQR+SAM: steps preconditioned by a slowly refreshed, learned structured :math:`U`.

Dufort-Labbé et al. (2026, ``docs/llqr.md``). Two time scales:

* slow: every ``K`` steps (``refresh``) the structured inverse preconditioner :math:`U`
  is refreshed as a moving average, on the batch of that step. By default it is
  *learned* by minimizing the LQR objective of the step :math:`-Ug`
  (:class:`~wsym.optim.learned.LQRPreconditioner`; ``preconditioner="diagonal"``,
  ``"kfac"``, ``"eigen"`` or ``"dense"``); ``"fisher-diagonal"`` and ``"fisher-kfac"``
  instead *estimate* it as the damped inverse of a structured Fisher
  (:mod:`wsym.optim.precondition`, the method wsym shipped before: the structured
  solutions of diagonal natural gradient and K-FAC, not the LQR minimizers);
* fast: :class:`LLQR` hands :math:`U g` to the base optimizer (one gradient per step);
  :class:`LLQRSAM` takes a SAM step in the metric :math:`P = U^{-1}`, with
  :math:`g = \nabla L(\theta)`:

.. math::
    \theta^+ = \theta + \rho\, \frac{U g}{\|g\|_U}, \quad \|g\|_U = \sqrt{g^\top U g},
    \qquad \theta \leftarrow \theta - \eta\, U \nabla L(\theta^+)

(the transported gradient :math:`U \nabla L(\theta^+)` goes through the base
optimizer). The perturbation has norm :math:`\rho` in the metric
:math:`U^{-1}`: :math:`\epsilon^\top U^{-1} \epsilon = \rho^2`.
``normalize="euclidean"`` divides by :math:`\|U g\|_2` instead, as the authors'
code does in practice ("less principled but more stable"); the perturbation then
has Euclidean norm :math:`\rho`.

Scale: a learned :math:`U` is rescaled at each refresh so that
:math:`\hat g^\top U \hat g = 1` on average over the refresh's unit gradients (the
Fisher estimates: :math:`U = 1` at the mean curvature): at equal learning rate the
step promises the first-order decrease of SGD's, so one grid serves every method
(``docs/llqr.md`` says what the robustness grid shows about it).

The refresh reads the batch of the step from hooks on the model: the inputs of the
last forward call and the gradient of the loss with respect to its outputs (recorded
at backward), so the closure and the training loop are unchanged. It runs after the
first pass of the step, before the perturbation; BatchNorm running statistics are
left untouched by it and by the perturbed pass. Models whose forward takes one or
more positional tensors and returns one tensor of outputs.

Example:
    >>> import torch
    >>> from wsym.models.networks import MLP
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
from wsym.optim.base import Closure, SharpnessAware, check_positive, frozen_buffers
from wsym.optim.learned import LQRPreconditioner
from wsym.optim.precondition import DiagonalFisher, KroneckerFisher, Preconditioner
from wsym.optim.structures import STRUCTURES

NORMALIZATIONS = ("metric", "euclidean")
ESTIMATED = {"fisher-diagonal": DiagonalFisher, "fisher-kfac": KroneckerFisher}
PRECONDITIONERS = (*STRUCTURES, *ESTIMATED)


class Recorder:
    """Forward hook: the last call's inputs and, at backward, the loss's gradient at its outputs."""

    def __init__(self, model: nn.Module):
        self.inputs: Any = None
        self.output_grad: Tensor | None = None
        self.active = True
        self.handle = model.register_forward_hook(self._forward)

    def _forward(self, module: nn.Module, args: tuple, output: Any) -> None:
        if not self.active:
            return
        args = tuple(a.detach() if isinstance(a, Tensor) else a for a in args)
        self.inputs = args[0] if len(args) == 1 else args
        self.output_grad = None
        if isinstance(output, Tensor) and output.requires_grad:
            output.register_hook(self._backward)

    def _backward(self, grad: Tensor) -> None:
        self.output_grad = grad.detach()


def make_preconditioner(preconditioner: Any, options: dict) -> Preconditioner:
    """A preconditioner from its name (learned structures, ``fisher-*`` estimates) or as given."""
    if isinstance(preconditioner, Preconditioner):
        return preconditioner
    if preconditioner in ESTIMATED:
        return ESTIMATED[preconditioner](beta=options["beta"], damping=options["damping"])
    if preconditioner in STRUCTURES:
        return LQRPreconditioner(preconditioner, **options)
    raise WsymInputError(
        f"unknown preconditioner {preconditioner!r}; use one of {', '.join(PRECONDITIONERS)} "
        "or a wsym.optim.Preconditioner"
    )


def _check_refresh(refresh: Any) -> None:
    if not isinstance(refresh, int) or isinstance(refresh, bool) or refresh < 1:
        raise WsymInputError(
            f"refresh (K) must be an integer >= 1, got {refresh!r}; pass e.g. refresh=100"
        )


class Preconditioned:
    """Shared by :class:`LLQR` and :class:`LLQRSAM`: the recorder, the refresh, :math:`U v`."""

    def _setup(self, model: nn.Module, preconditioner: Any, refresh: int, options: dict):
        if not isinstance(model, nn.Module):
            raise WsymInputError(
                f"{type(self).__name__} takes the model (an nn.Module), not its parameters"
            )
        _check_refresh(refresh)
        self.preconditioner = make_preconditioner(preconditioner, options)
        if hasattr(self.preconditioner, "check_model"):
            self.preconditioner.check_model(model)
        self.refresh, self.model = refresh, model
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.steps = 0
        self.recorder = Recorder(model)

    def maybe_refresh(self, params: list[Tensor]) -> None:
        """Refresh :math:`U` on the recorded batch when the step count is a multiple of K."""
        due = self.steps % self.refresh == 0
        self.steps += 1
        rec = self.recorder
        if not due or rec.inputs is None:
            return
        table = {n: p.detach() for n, p in zip(self.names, params, strict=True)}
        rec.active = False
        try:
            with frozen_buffers(self.model), torch.enable_grad():
                self.preconditioner.estimate(
                    self.model, table, rec.inputs, output_grad=rec.output_grad
                )
        finally:
            rec.active = True

    def precondition(self, tensors: list[Tensor]) -> list[Tensor]:
        """:math:`U v` for a list shaped like the parameters."""
        out = self.preconditioner.apply(dict(zip(self.names, tensors, strict=True)))
        return [out[n].to(t.dtype) for n, t in zip(self.names, tensors, strict=True)]


def _options(beta, damping, inner_steps, inner_lr, chunks, loss) -> dict:
    return dict(
        beta=beta, damping=damping, steps=inner_steps, lr=inner_lr, chunks=chunks, loss=loss
    )


class LLQR(Preconditioned, torch.optim.Optimizer):
    r"""LLQR alone: the base optimizer steps with :math:`U g` (one gradient per step).

    Used like any optimizer (``loss.backward(); opt.step()``) or with a closure.

    Args:
        model: the network.
        base_optimizer: optimizer class that receives :math:`U g`.
        preconditioner: a learned structure (``"diagonal"``, ``"kfac"``, ``"eigen"``,
            ``"dense"``), a Fisher estimate (``"fisher-diagonal"``, ``"fisher-kfac"``) or a
            :class:`~wsym.optim.precondition.Preconditioner`.
        refresh: ``K``, steps between refreshes (>= 1; the first step refreshes).
        beta: moving-average factor of the refresh, in [0, 1).
        damping: relative damping, > 0.
        inner_steps, inner_lr, chunks: the learned refresh's inner loop
            (:class:`~wsym.optim.learned.LQRPreconditioner`).
        loss: ``"cross_entropy"`` or ``"mse"``: the output Hessian of the quadratic model.
        **kwargs: passed to ``base_optimizer`` (``lr``, ``momentum``, ...).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> model, x, y = torch.nn.Linear(4, 3), torch.randn(32, 4), torch.randint(0, 3, (32,))
        >>> opt = LLQR(model, lr=0.5, refresh=5, preconditioner="diagonal")
        >>> losses = []
        >>> for _ in range(10):
        ...     opt.zero_grad()
        ...     loss = torch.nn.functional.cross_entropy(model(x), y)
        ...     loss.backward()
        ...     opt.step()
        ...     losses.append(float(loss.detach()))
        >>> losses[-1] < losses[0]
        True
    """

    def __init__(
        self,
        model: nn.Module,
        base_optimizer: type[torch.optim.Optimizer] = torch.optim.SGD,
        preconditioner: str | Preconditioner = "kfac",
        refresh: int = 100,
        beta: float = 0.95,
        damping: float = 0.1,
        inner_steps: int = 20,
        inner_lr: float = 0.05,
        chunks: int = 4,
        loss: str = "cross_entropy",
        **kwargs: Any,
    ):
        options = _options(beta, damping, inner_steps, inner_lr, chunks, loss)
        self._setup(model, preconditioner, refresh, options)
        if "lr" in kwargs:
            check_positive("lr", kwargs["lr"], "lr=0.1")
        params = [p for p in model.parameters() if p.requires_grad]
        super().__init__(params, dict(kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)
        self.state = self.base_optimizer.state

    @torch.no_grad()
    def step(self, closure: Closure | None = None) -> Tensor | None:  # type: ignore[override]
        """Refresh :math:`U` when due, then one base step with :math:`U g`."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for g in self.param_groups for p in g["params"]]
        self.maybe_refresh(params)
        used = [p.grad is not None for p in params]
        grads = [p.grad if u else torch.zeros_like(p) for p, u in zip(params, used, strict=True)]
        for p, g, u in zip(params, self.precondition(grads), used, strict=True):
            if u:
                p.grad = g
        self.base_optimizer.step()
        return loss


class LLQRSAM(Preconditioned, SharpnessAware):
    r"""LLQR+SAM (module docstring).

    Args:
        model: the network (BatchNorm statistics are protected during the ascent pass).
        base_optimizer: optimizer class that receives :math:`U \nabla L(\theta^+)`.
        rho: perturbation radius in the metric :math:`U^{-1}` (or Euclidean), > 0.
        preconditioner: as for :class:`LLQR` (default the learned ``"kfac"``).
        refresh: ``K``, steps between refreshes of :math:`U` (>= 1; the first step refreshes).
        beta: moving-average factor of the refresh, in [0, 1).
        damping: relative damping, > 0.
        normalize: ``"metric"`` (:math:`\sqrt{g^\top U g}`) or ``"euclidean"`` (:math:`\|Ug\|`).
        inner_steps, inner_lr, chunks, loss: as for :class:`LLQR`.
        **kwargs: passed to ``base_optimizer`` (``lr``, ``momentum``, ...).
    """

    def __init__(
        self,
        model: nn.Module,
        base_optimizer: type[torch.optim.Optimizer] = torch.optim.SGD,
        rho: float = 0.05,
        preconditioner: str | Preconditioner = "kfac",
        refresh: int = 100,
        beta: float = 0.95,
        damping: float = 0.1,
        normalize: str = "metric",
        inner_steps: int = 20,
        inner_lr: float = 0.05,
        chunks: int = 4,
        loss: str = "cross_entropy",
        **kwargs: Any,
    ):
        if normalize not in NORMALIZATIONS:
            raise WsymInputError(
                f"unknown normalize {normalize!r}; use one of {', '.join(NORMALIZATIONS)}"
            )
        options = _options(beta, damping, inner_steps, inner_lr, chunks, loss)
        self._setup(model, preconditioner, refresh, options)
        super().__init__(model, base_optimizer, rho, **kwargs)
        self.normalize = normalize

    def perturbation(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
        r"""Refresh :math:`U` when due, then :math:`\rho U g / \|g\|_U` (or ``/ \|Ug\|``)."""
        self.maybe_refresh(params)
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
