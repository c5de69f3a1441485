r"""The learned LLQR preconditioner: a structured :math:`U` fitted to the LQR objective, averaged.

At every refresh (every ``K`` steps of the optimizer that holds it), on the batch of
that step:

1. the network is linearized at :math:`\theta` (:class:`~wsym.optim.lqr.Linearization`)
   and the unit-norm gradients :math:`\hat g_c` of ``chunks`` parts of the batch are
   taken from the loss's output gradient;
2. starting from the current :math:`U`, ``steps`` Adam steps (learning rate ``lr``, in
   the relative parametrization of :mod:`wsym.optim.structures`) lower the mean LQR
   objective :math:`\ell(U; \hat g_c)` (:mod:`wsym.optim.lqr`): :math:`U_{new}`;
   ``eigen`` first fits the Kronecker factors, then the scales in their eigenbasis;
3. :math:`U_{new}` is rescaled so that the mean of :math:`\hat g_c^\top U \hat g_c` is 1
   (below); then :math:`U \leftarrow \beta U + (1 - \beta) U_{new}`, the weight of
   :math:`U_{new}` bias-corrected to :math:`(1 - \beta) / (1 - \beta^n)` at the n-th
   refresh (the first is taken as is; ``kfac`` averages its factors, ``eigen`` its factors
   and its scales projected onto the averaged eigenbasis). A fit that ends non-finite is
   dropped.

Scale. The LQR minimizer has the scale of an inverse curvature (the Newton step, a
learning rate of 1). Rescaled so that :math:`\hat g^\top U \hat g = 1` on average over
the refresh's gradients, the preconditioned step :math:`-\eta U g` promises, to first
order, the same loss decrease as the SGD step :math:`-\eta g` of the same learning rate;
directions flatter than the gradients' own curvature are amplified (by about
:math:`1 + 1/\text{damping}` at most when :math:`U = C^{-1}`), sharper ones shrunk. So one
learning-rate grid serves SGD, SAM and LLQR alike (the robustness grid of
``benchmarks/optimizers.py`` checks it). ``scale="newton"`` keeps the minimizer's own
scale instead; LLQR+SAM's perturbation :math:`\rho U g / \|g\|_U` grows as
:math:`\sqrt{U}`, so the two-scale quadratic's :math:`\bar\lambda^{-1/2}` amplification
(``tests/test_two_scale.py``) holds with it and is normalized away by ``"gradient"``.

Damping is relative: :math:`\lambda = \text{damping} \times \bar\kappa`, with
:math:`\bar\kappa` the mean curvature :math:`\hat g_c^\top J^\top H J \hat g_c` along the
refresh's gradients, so it does not depend on the loss scale.

Example:
    >>> import torch
    >>> from wsym.optim.lqr import Linearization
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Linear(4, 3)
    >>> x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    >>> out = model(x)
    >>> dz = torch.autograd.grad(torch.nn.functional.cross_entropy(out, y), out)[0]
    >>> u = LQRPreconditioner("kfac", steps=10)
    >>> params = {n: p.detach() for n, p in model.named_parameters()}
    >>> u.estimate(model, params, x, output_grad=dz)
    >>> grads = u.last_gradients
    >>> mean = sum(float(sum((g[n] * v[n]).sum() for n in g))
    ...            for g, v in ((g, u.apply(g)) for g in grads)) / len(grads)
    >>> round(mean, 6)
    1.0
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from wsym.errors import WsymInputError
from wsym.optim.lqr import LOSSES, Linearization, damping_value, fit
from wsym.optim.precondition import Preconditioner
from wsym.optim.structures import STRUCTURES, Eigen, Structure, blocks_of, check_factors

Params = dict[str, Tensor]
SCALES = ("gradient", "newton")


def check_structure(structure: Any) -> str:
    """The structure's name, or a :class:`WsymInputError` naming the choices."""
    if structure not in STRUCTURES:
        raise WsymInputError(f"unknown structure {structure!r}; use one of {', '.join(STRUCTURES)}")
    return structure


class LQRPreconditioner(Preconditioner):
    r"""Learned LLQR :math:`U` (module docstring).

    Args:
        structure: ``"diagonal"``, ``"kfac"``, ``"eigen"`` or ``"dense"``
            (:mod:`wsym.optim.structures`).
        beta: moving-average factor, in [0, 1).
        damping: relative damping of the quadratic model, > 0.
        steps: inner Adam steps per refresh, >= 1.
        lr: inner learning rate (a relative change of :math:`U` per step), > 0.
        chunks: number of batch parts whose gradients the objective averages, >= 1.
        loss: ``"cross_entropy"`` or ``"mse"``, for the output Hessian.
        scale: ``"gradient"`` (the rule above) or ``"newton"``: the LQR minimizer's own
            scale, an inverse curvature (learning rate 1 is the damped Newton step).
    """

    def __init__(
        self,
        structure: str = "kfac",
        beta: float = 0.95,
        damping: float = 0.1,
        steps: int = 20,
        lr: float = 0.05,
        chunks: int = 4,
        loss: str = "cross_entropy",
        scale: str = "gradient",
    ):
        super().__init__(beta=beta, damping=damping, normalize=None)
        if scale not in SCALES:
            raise WsymInputError(f"unknown scale {scale!r}; use one of {', '.join(SCALES)}")
        self.scale = scale
        self.structure = check_structure(structure)
        for name, value in (("steps", steps), ("chunks", chunks)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise WsymInputError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(lr, int | float) or not lr > 0:
            raise WsymInputError(f"lr must be > 0, got {lr!r}; pass e.g. lr=0.05")
        if loss not in LOSSES:
            raise WsymInputError(f"unknown loss {loss!r}; use one of {', '.join(LOSSES)}")
        self.steps, self.lr, self.chunks, self.loss = steps, float(lr), chunks, loss
        self.u: Structure | None = None
        self.last_gradients: list[Params] = []
        self.last_objective = float("nan")

    def estimate(
        self, model: nn.Module, params: Params, inputs: Any, output_grad: Tensor | None = None
    ) -> None:
        """Refresh :math:`U` on one batch (module docstring); ``output_grad`` is dL/d(outputs)."""
        if output_grad is None:
            raise WsymInputError(
                "the learned LLQR preconditioner needs the loss's gradient with respect to the "
                "outputs; use it through LLQR or LLQRSAM, which record it"
            )
        lin = Linearization(model, params, inputs, self.loss)
        grads = lin.gradients(output_grad, self.chunks)
        if not grads:
            return
        lam = damping_value(lin, grads, self.damping)
        if self.u is None:
            layout = blocks_of(model)
            check_factors(layout, self.structure)
            scale = 1.0 / max(lam * (1 + self.damping) / self.damping, 1e-300)
            self.u = STRUCTURES[self.structure](layout, scale)
        new = self.u.copy()
        if isinstance(new, Eigen):
            kron = new.kron.copy()
            fit(kron, lin, grads, self.damping, self.steps, self.lr, lam)
            new.rebase(kron)
            if self.refreshes == 0:
                new.reset_scales()
        self.last_objective = fit(new, lin, grads, self.damping, self.steps, self.lr, lam)
        if self.scale == "gradient":
            mean = sum(float(_dot(g, new.apply(g))) for g in grads) / len(grads)
            new.scale(1.0 / mean)
        if not new.finite():  # a failed fit (a diverged network): keep the current U
            return
        weight = (1 - self.beta) / (1 - self.beta ** (self.refreshes + 1))
        if self.refreshes == 0:
            self.u = new
        else:
            self.u.average(new, 1 - weight)
        self.last_gradients = grads
        self.refreshes += 1

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`WsymInputError` now if ``model`` cannot take the structure."""
        layout = blocks_of(model)
        check_factors(layout, self.structure)
        STRUCTURES[self.structure](layout, 1.0)

    def apply(self, grads: Params) -> Params:
        """:math:`U g` (the identity before the first refresh)."""
        if self.u is None:
            return dict(grads)
        return self.u.apply(grads)


def _dot(a: Params, b: Params):
    return sum((a[n].double() * b[n].double()).sum() for n in a)
