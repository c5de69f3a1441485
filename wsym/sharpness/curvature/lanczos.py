r"""Top Hessian eigenvalue by the Lanczos method with full reorthogonalization.

Starting from a seeded Gaussian unit vector :math:`q_1`, Lanczos builds an
orthonormal basis :math:`Q_k = [q_1, \dots, q_k]` of the Krylov space
:math:`\mathcal{K}_k(H, q_1)` and the tridiagonal
:math:`T_k = Q_k^\top H Q_k` (diagonal :math:`\alpha_j`, off-diagonal
:math:`\beta_j`) from one HVP per step:

.. math::
    w = H q_j - \alpha_j q_j - \beta_{j-1} q_{j-1}, \quad
    \alpha_j = q_j^\top H q_j, \quad \beta_j = \|w\|, \quad q_{j+1} = w / \beta_j.

In floating point the :math:`q_j` lose orthogonality as Ritz values converge, so
:math:`w` is orthogonalized against all of :math:`Q_k` (twice: "twice is enough").
The largest eigenvalue of :math:`T_k` (the largest Ritz value) approximates
:math:`\lambda_{\max}(H)` from below and is exact once :math:`k = P` or the Krylov
space becomes invariant (:math:`\beta_j \approx 0`). Memory: ``k`` flat vectors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from wsym.sharpness.curvature.objective import (
    Batch,
    HvpMode,
    LossFn,
    Params,
    flatten,
    hvp,
    model_params,
    unflatten,
)


def lambda_max(
    model: nn.Module,
    batches: Sequence[Batch],
    loss_fn: LossFn,
    iters: int = 30,
    seed: int = 0,
    params: Params | None = None,
    mode: HvpMode = "reverse",
) -> float:
    r"""Largest Ritz value of ``iters`` Lanczos steps on the Hessian of the mean loss.

    Args:
        model: the network, evaluated in eval mode (see :mod:`wsym.sharpness.curvature.objective`).
        batches: list of ``(inputs, targets)``.
        loss_fn: ``loss_fn(outputs, targets)``, a mean over the batch.
        iters: Krylov dimension ``k`` (capped at the number of parameters ``P``); one
            HVP per step.
        seed: seed of the CPU generator for the start vector; same seed, same value.
        params: ``{name: tensor}``; ``None`` takes the model's.
        mode: HVP mode, ``"forward"`` or ``"reverse"`` (see :func:`~wsym.sharpness.curvature.hvp`).

    Returns:
        :math:`\max \operatorname{eig}(T_k)`, a lower bound on (and, as ``k`` grows, an
        estimate of) :math:`\lambda_{\max}(\nabla^2 \mathcal{L})`.

    Example:
        >>> model = nn.Linear(2, 1, bias=False)
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> loss = lambda out, y: ((out - y) ** 2).mean()  # H = diag(1, 4)
        >>> round(lambda_max(model, [(x, torch.zeros(2, 1))], loss), 5)
        4.0
    """
    params = model_params(model) if params is None else params
    names = list(params)
    first = params[names[0]]
    size = sum(p.numel() for p in params.values())
    k = min(int(iters), size)
    if k < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(size, generator=gen, dtype=torch.float64).to(first.device, first.dtype)
    basis = [q / q.norm()]
    alphas: list[torch.Tensor] = []
    betas: list[torch.Tensor] = []
    for j in range(k):
        w = flatten(hvp(model, params, batches, loss_fn, unflatten(basis[j], params), mode), names)
        alphas.append(w @ basis[j])
        Q = torch.stack(basis)
        for _ in range(2):  # full reorthogonalization, twice
            w = w - Q.T @ (Q @ w)
        beta = w.norm()
        scale = max(float(a.abs()) for a in alphas) + (float(betas[-1]) if betas else 0.0)
        if j == k - 1 or float(beta) <= 1e-12 * max(scale, 1e-300):
            break  # last step, or the Krylov space is invariant: T_k is exact
        betas.append(beta)
        basis.append(w / beta)
    T = torch.diag(torch.stack(alphas))
    if betas:
        off = torch.stack(betas)
        T = T + torch.diag(off, 1) + torch.diag(off, -1)
    return float(torch.linalg.eigvalsh(T.double()).max())
