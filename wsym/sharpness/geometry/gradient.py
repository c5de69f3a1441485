"""Riemannian gradients: the tangent vector ``r`` with ``<r, xi>_metric = <grad, xi>``.

With the regularized Gram matrices ``P = G^T G + s_G I``, ``Q = H^T H + s_H I``:

* euclidean: ``(grad_G, grad_H)``;
* invariant: ``(grad_G P, grad_H Q)``;
* mixed:     ``(grad_G Q^{-1}, grad_H P^{-1})``;
* elementwise adaptive (plain parameters): ``grad * (w^2 + s)``.

For a loss that depends on the block only through ``G H^T`` the Euclidean gradient
is Euclidean-orthogonal to the orbit, so the Riemannian gradient is already
horizontal; the projection (on by default) removes the vertical part that any
other term (weight decay, round-off) introduces.
"""

from __future__ import annotations

from torch import Tensor

from wsym.sharpness.geometry.block import DEFAULT_EPS, Gram, Metric, Pair, as_pair, check_metric, mm
from wsym.sharpness.geometry.horizontal import horizontal
from wsym.sharpness.geometry.metrics import _elementwise_shift


def riemannian_gradient(
    block: Pair | tuple[Tensor, Tensor],
    grad: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    eps: float = DEFAULT_EPS,
    project: bool = True,
) -> Pair:
    """Riemannian gradient of a loss at ``block`` from its Euclidean gradient ``grad``.

    Args:
        block: G ``(..., n, h)``, H ``(..., m, h)``.
        grad: ``(dl/dG, dl/dH)`` of the same shapes.
        metric: ``"euclidean"``, ``"invariant"`` or ``"mixed"``.
        eps: Gram regularization, the same as passed to :func:`~wsym.sharpness.geometry.inner`.
        project: project the result onto the horizontal space.

    Returns:
        A :class:`Pair` ``r`` with ``inner(block, r, xi) == <grad, xi>`` for every
        ``xi`` (every horizontal ``xi`` when projecting a non-invariant loss's gradient).

    Example:
        >>> import torch
        >>> from wsym.sharpness.geometry import inner
        >>> G, H = torch.randn(4, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
        >>> T = torch.randn(4, 3, dtype=torch.float64)
        >>> grad = (2 * (G @ H.T - T) @ H, 2 * (G @ H.T - T).T @ G)
        >>> r = riemannian_gradient((G, H), grad, "mixed")
        >>> xi = (torch.randn_like(G), torch.randn_like(H))
        >>> euclid = (grad[0] * xi[0]).sum() + (grad[1] * xi[1]).sum()
        >>> torch.allclose(inner((G, H), r, xi, "mixed"), euclid)
        True
    """
    G, H = as_pair(block)
    gG, gH = as_pair(grad)
    metric = check_metric(metric)
    if metric == "invariant":
        r = Pair(mm(gG, Gram.of(G, eps).matrix), mm(gH, Gram.of(H, eps).matrix))
    elif metric == "mixed":
        r = Pair(Gram.of(H, eps).solve(gG, left=False), Gram.of(G, eps).solve(gH, left=False))
    else:
        r = Pair(gG, gH)
    return horizontal((G, H), r, metric, eps) if project else r


def adaptive_gradient(w: Tensor, grad: Tensor, eps: float = DEFAULT_EPS) -> Tensor:
    """Riemannian gradient ``grad * (w^2 + s)`` for :func:`~wsym.sharpness.geometry.adaptive_inner`.

    Example:
        >>> import torch
        >>> adaptive_gradient(torch.tensor([2.0, -1.0]), torch.tensor([1.0, 1.0]), eps=0)
        tensor([4., 1.])
    """
    return grad * (w * w + _elementwise_shift(w, eps))
