"""Christoffel symbols and the second-order geodesic step on a GL block.

A geodesic ``gamma`` with ``gamma(0) = theta`` and ``gamma'(0) = xi`` solves
``gamma'' = -Gamma(gamma', gamma')``, so ``gamma(1) = theta + xi - 1/2 Gamma(xi, xi)
+ O(|xi|^3)``. From the Euler-Lagrange equations of the energy
``1/2 <gamma', gamma'>`` (``P = G^T G + s_G I``, ``Q = H^T H + s_H I``, the shifts
frozen at the base point):

* invariant (G and H decoupled; H likewise with ``Q``):
  ``Gamma(xi, xi)_G = -xi_G P^{-1} (xi_G^T G + G^T xi_G) + G P^{-1} xi_G^T xi_G``;
* mixed (coupled; H by the symmetry ``G <-> H``):
  ``Gamma(xi, xi)_G = xi_G (xi_H^T H + H^T xi_H) Q^{-1} - G (xi_H^T xi_H) Q^{-1}``;
* euclidean: ``Gamma = 0`` (straight lines).

On a ``1 x 1`` block (a diagonal linear network coordinate ``(u, v)``, horizontal
``xi = b (u, v)``) the step is the Taylor expansion to second order of the exact
geodesics ``(u, v) e^{bt}`` (invariant) and ``(u, v) sqrt(1 + 2bt)`` (mixed).
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsym.geometry.block import DEFAULT_EPS, Gram, Metric, Pair, as_pair, check_metric


def _invariant_part(M: Tensor, xi: Tensor, eps: float) -> Tensor:
    """``-xi P^{-1} (xi^T M + M^T xi) + M P^{-1} xi^T xi`` with ``P = M^T M + s I``."""
    cross = xi.mT @ M
    h = M.shape[-1]
    Z = Gram.of(M, eps).solve(torch.cat([cross + cross.mT, xi.mT @ xi], dim=-1))
    return -xi @ Z[..., :h] + M @ Z[..., h:]


def christoffel(
    block: Pair | tuple[Tensor, Tensor],
    xi: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    eps: float = DEFAULT_EPS,
) -> Pair:
    """The quadratic form ``Gamma(xi, xi)`` of the metric's Christoffel symbols at ``block``.

    Args:
        block: G ``(..., n, h)``, H ``(..., m, h)``.
        xi: tangent vector of the same shapes.
        metric: ``"euclidean"``, ``"invariant"`` or ``"mixed"``.
        eps: Gram regularization (constant along the geodesic); 0 for exact formulas.

    Returns:
        A :class:`Pair` of the shapes of ``xi``; the geodesic acceleration is its negative.

    Example:
        >>> u, v = torch.tensor([[2.0]]), torch.tensor([[3.0]])
        >>> christoffel((u, v), (0.5 * u, 0.5 * v), "invariant", eps=0)  # -b^2 (u, v)
        Pair(G=tensor([[-0.5000]]), H=tensor([[-0.7500]]))
    """
    G, H = as_pair(block)
    xG, xH = as_pair(xi)
    metric = check_metric(metric)
    if metric == "euclidean":
        return Pair(torch.zeros_like(xG), torch.zeros_like(xH))
    if metric == "invariant":
        return Pair(_invariant_part(G, xG, eps), _invariant_part(H, xH, eps))
    P, Q = Gram.of(G, eps), Gram.of(H, eps)
    cross_H, cross_G = xH.mT @ H, xG.mT @ G
    gamma_G = xG @ (cross_H + cross_H.mT) - G @ (xH.mT @ xH)
    gamma_H = xH @ (cross_G + cross_G.mT) - H @ (xG.mT @ xG)
    return Pair(Q.solve(gamma_G, left=False), P.solve(gamma_H, left=False))


def geodesic_step(
    block: Pair | tuple[Tensor, Tensor],
    xi: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    eps: float = DEFAULT_EPS,
) -> Pair:
    """Second-order approximation ``theta + xi - 1/2 Gamma(xi, xi)`` of ``exp_theta(xi)``.

    Pass a horizontal ``xi`` (:func:`~wsym.geometry.horizontal`) to move on the
    quotient. Agrees with the exact geodesic to ``O(|xi|^3)``.

    Args:
        block: G ``(..., n, h)``, H ``(..., m, h)``.
        xi: tangent vector of the same shapes.
        metric: ``"euclidean"``, ``"invariant"`` or ``"mixed"``.
        eps: Gram regularization; 0 for exact formulas.

    Returns:
        The new block, a :class:`Pair`.

    Example:
        >>> u, v, b = torch.tensor([[2.0]]), torch.tensor([[3.0]]), 0.1
        >>> G, H = geodesic_step((u, v), (b * u, b * v), "mixed", eps=0)
        >>> torch.allclose(G, u * (1 + b - b**2 / 2))  # u sqrt(1 + 2b) to second order
        True
    """
    G, H = as_pair(block)
    xG, xH = as_pair(xi)
    gamma = christoffel((G, H), (xG, xH), metric, eps)
    return Pair(G + xG - 0.5 * gamma.G, H + xH - 0.5 * gamma.H)


def _sym(M: Tensor) -> Tensor:
    return M + M.mT


def _invariant_vjp(M: Tensor, xi: Tensor, g: Tensor, eps: float) -> Tensor:
    """``g - (d/dv Gamma(xi, xi)/2 [v])^T g`` for one decoupled factor (invariant metric)."""
    P = Gram.of(M, eps)
    S = _sym(xi.mT @ M)
    h = M.shape[-1]
    Z = P.solve(torch.cat([xi.mT @ g, M.mT @ g], dim=-1))  # P^-1 xi^T g, P^-1 M^T g
    adj = -0.5 * P.solve(g @ S, left=False) - 0.5 * M @ _sym(Z[..., :h])
    return g - (adj + 0.5 * xi @ _sym(Z[..., h:]))


def geodesic_step_vjp(
    block: Pair | tuple[Tensor, Tensor],
    xi: Pair | tuple[Tensor, Tensor],
    cotangent: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    eps: float = DEFAULT_EPS,
) -> Pair:
    """Vector-Jacobian product of :func:`geodesic_step` with respect to ``xi``, in closed form.

    The step is ``xi -> theta + xi - Gamma(xi, xi) / 2`` with ``Gamma`` symmetric and
    bilinear, so its differential is ``v -> v - Gamma(xi, v)`` and the VJP is
    ``g - Gamma(xi, .)^T g``, written out per metric (no autograd graph).

    Args:
        block: G ``(..., n, h)``, H ``(..., m, h)``.
        xi: tangent vector of the same shapes.
        cotangent: ``(dL/dG', dL/dH')`` at the stepped block.
        metric: ``"euclidean"``, ``"invariant"`` or ``"mixed"``.
        eps: Gram regularization; 0 for exact formulas.

    Returns:
        ``(dL/dxi_G, dL/dxi_H)``, a :class:`Pair`.

    Example:
        >>> G, H = torch.randn(4, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
        >>> xi = (torch.randn_like(G).requires_grad_(), torch.randn_like(H).requires_grad_())
        >>> g = (torch.randn_like(G), torch.randn_like(H))
        >>> auto = torch.autograd.grad(geodesic_step((G, H), xi, "mixed"), xi, grad_outputs=g)
        >>> closed = geodesic_step_vjp((G, H), [x.detach() for x in xi], g, "mixed")
        >>> all(torch.allclose(a, b) for a, b in zip(auto, closed))
        True
    """
    G, H = as_pair(block)
    xG, xH = as_pair(xi)
    gG, gH = as_pair(cotangent)
    metric = check_metric(metric)
    if metric == "euclidean":
        return Pair(gG, gH)
    if metric == "invariant":
        return Pair(_invariant_vjp(G, xG, gG, eps), _invariant_vjp(H, xH, gH, eps))
    P, Q = Gram.of(G, eps), Gram.of(H, eps)
    tG, tH = Q.solve(gG, left=False), P.solve(gH, left=False)  # g_G Q^-1, g_H P^-1
    # G output (Gamma_G = xi_G S_H Q^-1 - G xi_H^T xi_H Q^-1, S_H = sym(xi_H^T H))
    MG, NG = xG.mT @ tG, G.mT @ tG
    MH, NH = xH.mT @ tH, H.mT @ tH
    adj_G = 0.5 * tG @ _sym(xH.mT @ H) + 0.5 * G @ _sym(MH) - 0.5 * xG @ _sym(NH)
    adj_H = 0.5 * tH @ _sym(xG.mT @ G) + 0.5 * H @ _sym(MG) - 0.5 * xH @ _sym(NG)
    return Pair(gG - adj_G, gH - adj_H)
