r"""The LQR objective of a preconditioned step, through the network's linearization.

For the step :math:`\Delta\theta = -U g` the local quadratic model of the loss (Gauss-Newton,
damped) gives the LQR objective of Dufort-Labbé et al. (2026), ``docs/llqr.md``:

.. math::
    \ell(U; g) = -g^\top U g + \tfrac12 \|J U g\|^2_{H} + \tfrac{\lambda}{2} \|U g\|^2,

with :math:`J` the Jacobian of the network's outputs with respect to the parameters on
the batch, :math:`H` the Hessian of the loss with respect to the outputs (softmax
cross-entropy: :math:`\operatorname{diag}(p) - p p^\top` per row; squared error: the
identity; both divided by the number of rows) and :math:`\lambda` the damping. The
quadratic term is one Jacobian-vector product (:func:`torch.func.jvp`); its
gradient with respect to :math:`v = Ug` is :math:`(J^\top H J + \lambda) v - g`, one
vector-Jacobian product, so the structured :math:`U` is learned by autograd through
:math:`v = U g` only. Over all :math:`U` the minimum is at :math:`U g = C^{-1} g` with
:math:`C = J^\top H J + \lambda I`, value :math:`-\tfrac12 g^\top C^{-1} g`
(:func:`wsym.testing.oracles.optim.dense_curvature` builds :math:`C` for the float64 reference).

The gradients :math:`g` are those of ``chunks`` equal parts of the batch, each of the
per-row loss terms (:math:`g_c = J^\top (\partial L / \partial z)_c`, from the loss's output
gradient of the training step, so no targets are needed), normalized to unit length
as in the authors' code; the objective is their mean. With one gradient any positive
diagonal in a suitable basis could fit it exactly; several gradients make the learned
:math:`U` a property of the geometry, not of one direction (for the dense structure the
optimum is then :math:`U = C^{-1}` on their span, exactly).

BatchNorm in training mode is linearized with batch statistics and without touching
its running statistics.

Example:
    >>> import torch
    >>> from wsym.optim.structures import Diagonal, blocks_of
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Linear(4, 3).double()
    >>> x, y = torch.randn(16, 4, dtype=torch.float64), torch.randint(0, 3, (16,))
    >>> out = model(x)
    >>> dz = torch.autograd.grad(torch.nn.functional.cross_entropy(out, y), out)[0]
    >>> lin = Linearization(model, dict(model.named_parameters()), x, "cross_entropy")
    >>> grads = lin.gradients(dz, chunks=4)
    >>> u = Diagonal(blocks_of(model), 1.0)
    >>> value = fit(u, lin, grads, damping=0.1, steps=50)
    >>> value < objective(Diagonal(blocks_of(model), 1.0), lin, grads, 0.1)
    True
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import jvp, vjp, vmap

from wsym.errors import WsymInputError
from wsym.optim.structures import Structure
from wsym.sharpness.curvature.objective import call

Params = dict[str, Tensor]
LOSSES = ("cross_entropy", "mse")


@contextmanager
def batch_statistics(model: nn.Module):
    """BatchNorm layers in training mode use batch statistics and record nothing, then restore."""
    saved = []
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training and m.track_running_stats:
            saved.append((m, m.running_mean, m.running_var, m.num_batches_tracked))
            m.running_mean = m.running_var = m.num_batches_tracked = None
            m.track_running_stats = False
    try:
        yield
    finally:
        for m, mean, var, count in saved:
            m.running_mean, m.running_var, m.num_batches_tracked = mean, var, count
            m.track_running_stats = True


def _dot(a: Params, b: Params) -> Tensor:
    return sum((a[n].double() * b[n].double()).sum() for n in a)


class Linearization:
    """The network linearized at ``params`` on one batch: ``J v``, ``J^T u`` and ``H u``.

    Args:
        model: the network.
        params: ``{name: tensor}`` of the trainable parameters (detached).
        inputs: the batch's inputs (a tensor or a tuple of positional inputs).
        loss: ``"cross_entropy"`` (logits ``(..., classes)``) or ``"mse"``.
    """

    def __init__(self, model: nn.Module, params: Params, inputs: Any, loss: str):
        if loss not in LOSSES:
            raise WsymInputError(f"unknown loss {loss!r}; use one of {', '.join(LOSSES)}")
        self.loss, self.names = loss, list(params)
        params = {n: p.detach() for n, p in params.items()}

        def f(p):
            return call(model, p, inputs)

        self.model, self._f, self.params = model, f, params
        with batch_statistics(model):
            self.output, self._vjp = vjp(f, params)
        if not isinstance(self.output, Tensor):
            raise WsymInputError("learned LLQR needs a model that returns one tensor of outputs")
        self.dtypes = {n: p.dtype for n, p in params.items()}

    def jvp(self, v: Params) -> Tensor:
        """:math:`J v`, shaped like the outputs."""
        tangent = {n: v[n].to(self.dtypes[n]) for n in self.names}
        with batch_statistics(self.model):
            return jvp(self._f, (self.params,), (tangent,))[1]

    def vjp(self, u: Tensor) -> Params:
        r""":math:`J^\top u` for ``u`` shaped like the outputs."""
        return self._vjp(u.to(self.output.dtype))[0]

    def hessian(self, u: Tensor) -> Tensor:
        """:math:`H u`, the loss's output Hessian (mean over rows) applied to ``u``."""
        z = self.output.detach()
        if self.loss == "mse":
            rows = z.shape[0] if z.ndim else 1
            return u / rows
        z = z.reshape(-1, z.shape[-1])
        p = torch.softmax(z.double(), -1)
        w = u.reshape(z.shape).double()
        hu = (p * w - p * (p * w).sum(-1, keepdim=True)) / z.shape[0]
        return hu.reshape(u.shape)

    def curvature(self, v: Params) -> Tensor:
        r""":math:`v^\top J^\top H J v`."""
        jv = self.jvp(v).double()
        return (jv * self.hessian(jv)).sum()

    def gradients(self, output_grad: Tensor, chunks: int) -> list[Params]:
        """Unit-norm gradients of ``chunks`` equal parts of the batch (rows of the outputs)."""
        rows = output_grad.shape[0]
        out = []
        for idx in torch.arange(rows).chunk(min(chunks, rows)):
            mask = torch.zeros_like(output_grad)
            mask[idx] = output_grad[idx]
            g = {n: t.detach().double() for n, t in self.vjp(mask).items()}
            size = float(_dot(g, g)) ** 0.5
            if size > 0:
                out.append({n: t / size for n, t in g.items()})
        return out


def damping_value(lin: Linearization, grads: list[Params], damping: float) -> float:
    r""":math:`\lambda = \text{damping} \times \bar\kappa`, the mean curvature along ``grads``."""
    kappa = sum(float(lin.curvature(g)) for g in grads) / max(len(grads), 1)
    return damping * kappa


def _gauss_newton(lin: Linearization, v: Params) -> tuple[Tensor, Params]:
    """``(v^T G v, G v)`` for one tangent ``v``, ``G = J^T H J``."""
    jv = lin.jvp(v).double()
    hjv = lin.hessian(jv)
    return (jv * hjv).sum(), {n: t.double() for n, t in lin.vjp(hjv).items()}


def _terms(u: Structure, lin: Linearization, grads, lam: float, raw=None):
    """Mean objective over ``grads`` and, with ``raw``, a surrogate whose gradient is its own.

    The chunk gradients are stacked and the network's JVP/VJP batched over them
    (``torch.func.vmap``).
    """
    stacked = {n: torch.stack([g[n] for g in grads]) for n in grads[0]}
    v = vmap(lambda g: u.apply(g, raw))(stacked)
    vd = {n: t.detach() for n, t in v.items()}
    quad, back = vmap(lambda t: _gauss_newton(lin, t))(vd)
    lin_term = sum((stacked[n] * vd[n].double()).flatten(1).sum(1) for n in stacked)
    sq = sum((vd[n].double() ** 2).flatten(1).sum(1) for n in stacked)
    total = float((-lin_term + 0.5 * quad + 0.5 * lam * sq).mean())
    surrogate = 0.0
    if raw is not None:
        w = {n: back[n] + lam * vd[n].double() - stacked[n] for n in stacked}
        surrogate = sum((w[n] * v[n].double()).sum() for n in stacked) / len(grads)
    return total, surrogate


def objective(u: Structure, lin: Linearization, grads: list[Params], lam: float) -> float:
    r"""Mean LQR objective :math:`\ell(U; g)` over ``grads`` at the current :math:`U`."""
    return _terms(u, lin, grads, lam)[0]


def fit(
    u: Structure,
    lin: Linearization,
    grads: list[Params],
    damping: float,
    steps: int = 20,
    lr: float = 0.05,
    lam: float | None = None,
) -> float:
    """Minimize the mean LQR objective over ``u``'s structure (Adam, ``steps``); returns its value.

    ``damping`` is relative (:func:`damping_value`) unless the absolute ``lam`` is given.
    ``u`` is updated in place, starting from its current value.
    """
    lam = damping_value(lin, grads, damping) if lam is None else lam
    raw = u.raw()
    opt = torch.optim.Adam(raw, lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        _, surrogate = _terms(u, lin, grads, lam, raw)
        surrogate.backward()
        opt.step()
    u.update([r.detach() for r in raw])
    return objective(u, lin, grads, lam)
