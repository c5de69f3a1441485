"""Riemannian metrics on GL blocks and the elementwise adaptive metric.

For tangent vectors ``eta, zeta`` at a block ``(G, H)``, with the regularized Gram
matrices ``P = G^T G + s_G I`` and ``Q = H^T H + s_H I`` (see
:mod:`wsym.sharpness.geometry.block`):

* ``euclidean``: ``Tr[eta_G^T zeta_G + eta_H^T zeta_H]``;
* ``invariant``: ``Tr[P^{-1} eta_G^T zeta_G + Q^{-1} eta_H^T zeta_H]``;
* ``mixed``:     ``Tr[Q eta_G^T zeta_G + P eta_H^T zeta_H]``.

The invariant and mixed metrics are unchanged by the ``GL(h)`` action (exactly at
``eps = 0``), so they descend to the quotient. Plain parameters ``w`` use the
elementwise adaptive metric ``sum(eta * zeta / (w^2 + s))``, invariant under
elementwise rescalings.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsym.sharpness.geometry.block import DEFAULT_EPS, Gram, Metric, Pair, as_pair, check_metric, mm


def _trace_product(S: Tensor, K: Tensor) -> Tensor:
    """``Tr[S K]`` over the last two dims, without forming the product."""
    return (S.mT * K).sum((-2, -1))


def inner(
    block: Pair | tuple[Tensor, Tensor],
    eta: Pair | tuple[Tensor, Tensor],
    zeta: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """Metric inner product ``<eta, zeta>`` at ``block``, one value per block.

    Args:
        block: G ``(..., n, h)``, H ``(..., m, h)``.
        eta: tangent vector of the same shapes.
        zeta: tangent vector of the same shapes.
        metric: ``"euclidean"``, ``"invariant"`` or ``"mixed"`` (module docstring).
        eps: Gram regularization relative to the mean eigenvalue; 0 for the exact metric.

    Returns:
        Tensor of shape ``(...)``; sum it for a network with several blocks.

    Example:
        >>> G, H = torch.randn(2, 5, 3, dtype=torch.float64), torch.randn(2, 4, 3).double()
        >>> A = torch.randn(3, 3, dtype=torch.float64) + 3 * torch.eye(3)
        >>> from wsym.sharpness.geometry import act
        >>> xi = (torch.randn_like(G), torch.randn_like(H))
        >>> a = inner((G, H), xi, xi, "mixed", eps=0)
        >>> b = inner(act((G, H), A), act(xi, A), act(xi, A), "mixed", eps=0)
        >>> a.shape, bool(torch.allclose(a, b))
        (torch.Size([2]), True)
    """
    G, H = as_pair(block)
    eG, eH = as_pair(eta)
    zG, zH = as_pair(zeta)
    metric = check_metric(metric)
    KG, KH = mm(eG.mT, zG), mm(eH.mT, zH)
    if metric == "euclidean":
        return KG.diagonal(dim1=-2, dim2=-1).sum(-1) + KH.diagonal(dim1=-2, dim2=-1).sum(-1)
    P, Q = Gram.of(G, eps), Gram.of(H, eps)
    if metric == "invariant":
        if P.inverse is not None and Q.inverse is not None:
            return _trace_product(P.inverse, KG) + _trace_product(Q.inverse, KH)
        tr_G = P.solve(KG).diagonal(dim1=-2, dim2=-1).sum(-1)
        return tr_G + Q.solve(KH).diagonal(dim1=-2, dim2=-1).sum(-1)
    return _trace_product(Q.matrix, KG) + _trace_product(P.matrix, KH)


def norm(
    block: Pair | tuple[Tensor, Tensor],
    xi: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """Metric norm ``sqrt(<xi, xi>)`` of a tangent vector, one value per block ``(...)``.

    Example:
        >>> G, H = torch.eye(3, 2), torch.eye(4, 2)
        >>> float(norm((G, H), (G, H), "euclidean") ** 2)
        4.0
    """
    return inner(block, xi, xi, metric, eps).clamp_min(0).sqrt()


def _elementwise_shift(w: Tensor, eps: float) -> Tensor:
    """``eps * mean(w^2)`` (``eps`` when ``w`` is all zero)."""
    mean = (w * w).mean()
    return torch.where(mean > 0, eps * mean, torch.full_like(mean, eps))


def adaptive_inner(w: Tensor, eta: Tensor, zeta: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    """Elementwise adaptive metric ``sum(eta * zeta / (w^2 + s))``, ``s = eps * mean(w^2)``.

    ``||xi||^2 = ||xi / |w| ||_2^2`` (for ``eps -> 0``): the metric of adaptive
    sharpness, invariant under ``w -> a * w, xi -> a * xi`` for any ``a != 0``
    elementwise.

    Args:
        w: parameter tensor, any shape.
        eta: tangent vector, same shape as ``w``.
        zeta: tangent vector, same shape as ``w``.
        eps: shift relative to the mean of ``w^2``.

    Returns:
        A 0-dim tensor.

    Example:
        >>> w = torch.tensor([1.0, -2.0])
        >>> float(adaptive_inner(w, torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]), eps=0))
        2.0
    """
    return (eta * zeta / (w * w + _elementwise_shift(w, eps))).sum()


def adaptive_norm(w: Tensor, xi: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    """Elementwise adaptive norm ``||xi / |w| ||_2`` (0-dim tensor), see :func:`adaptive_inner`."""
    return adaptive_inner(w, xi, xi, eps).clamp_min(0).sqrt()
