"""Slow, obvious references for the curvature estimators: dense matrices and loops.

For tiny models in float64 only: each builds a ``P x P`` matrix (``P`` the number
of parameters) or loops over samples in Python. The fast estimators in
:mod:`wsym.sharpness.curvature` are tested against these.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, hessian, jacrev

from wsym.sharpness.curvature.objective import (
    Batch,
    LossFn,
    Params,
    as_args,
    batch_size,
    batch_weights,
    eval_mode,
    flatten,
    model_params,
    unflatten,
)


def dense_hessian(
    model: nn.Module, batches: Sequence[Batch], loss_fn: LossFn, params: Params | None = None
) -> Tensor:
    """``torch.func.hessian`` of the mean loss on the flattened parameters, ``(P, P)``.

    Example:
        >>> model = nn.Linear(2, 1, bias=False)
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
        >>> dense_hessian(model, [(x, torch.zeros(2, 1))], lambda o, y: ((o - y) ** 2).mean())
        tensor([[1., 0.],
                [0., 4.]])
    """
    params = model_params(model) if params is None else params

    def loss(flat: Tensor) -> Tensor:
        p = unflatten(flat, params)
        terms = [
            w * loss_fn(functional_call(model, p, as_args(x)), y)
            for w, (x, y) in zip(batch_weights(batches), batches, strict=True)
        ]
        return torch.stack(terms).sum()

    with eval_mode(model):
        return hessian(loss)(flatten(params, list(params)))


def dense_fisher(
    model: nn.Module, batches: Sequence[Batch], params: Params | None = None
) -> Tensor:
    r"""Exact Fisher :math:`\frac1N \sum_n J_n^\top (\operatorname{diag} p_n - p_n p_n^\top) J_n`.

    :math:`J_n` is the Jacobian of the logits of sample ``n`` with respect to the
    flattened parameters; for cross-entropy this is also the GGN. ``(P, P)``.
    """
    params = model_params(model) if params is None else params
    names = list(params)
    total, count = 0.0, 0
    with eval_mode(model):
        for x, _ in batches:
            args = as_args(x)

            def logits(flat: Tensor, args: tuple = args) -> Tensor:
                return functional_call(model, unflatten(flat, params), args)

            flat = flatten(params, names)
            J = jacrev(logits)(flat)  # (N, C, P)
            p = logits(flat).softmax(-1)
            lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
            total = total + torch.einsum("ncp,ncd,ndq->pq", J, lam, J)
            count += batch_size(x)
    return total / count


def per_sample_fisher_diagonal(
    model: nn.Module,
    batches: Sequence[Batch],
    labels: Sequence[Tensor],
    params: Params | None = None,
) -> Params:
    r""":math:`\frac{1}{NS}\sum_{n,s} (\nabla \ell_n(y_{n,s}))^2` by a loop over samples.

    Args:
        model: a classifier; evaluated in eval mode.
        batches: list of ``(inputs, targets)``; targets are ignored.
        labels: per batch, the labels ``(N, S)`` to use.
        params: ``{name: tensor}``; ``None`` takes the model's.

    Returns:
        ``{name: tensor}`` with the shapes of ``params``.
    """
    params = model_params(model) if params is None else params
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    count = 0
    with eval_mode(model):
        for (x, _), ys in zip(batches, labels, strict=True):
            args = as_args(x)
            for i in range(batch_size(x)):
                one = tuple(a[i : i + 1] for a in args)
                for y in ys[i]:

                    def nll(p: Params, one: tuple = one, y: Tensor = y) -> Tensor:
                        return -functional_call(model, p, one)[0].log_softmax(-1)[y]

                    g = grad(nll)(params)
                    for n in total:
                        total[n] += g[n] ** 2 / ys.shape[1]
            count += batch_size(x)
    return {n: t / count for n, t in total.items()}
