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

from collections.abc import Callable

import torch
from torch import Tensor

from wsym.sharpness.geometry.block import (
    DEFAULT_EPS,
    Gram,
    Metric,
    Pair,
    addmm,
    as_pair,
    check_metric,
    mm,
)


def _sym(M: Tensor) -> Tensor:
    return M + M.mT


class _Cross:
    """``x^T M`` and ``x^T x`` of a factor ``M`` and its tangent ``x``, and ``[M | x]^T g``.

    Where ``h > 1`` each is one product with ``[M | x]`` (kept for the VJP's products).
    """

    def __init__(self, x: Tensor, M: Tensor):
        self.h = M.shape[-1]
        self.x, self.M = x, M
        self.both = None if self.h == 1 else torch.cat([M, x], dim=-1)
        if self.both is None:
            self.xM, self.xx = mm(x.mT, M), mm(x.mT, x)
        else:
            T = mm(x.mT, self.both)
            self.xM, self.xx = T[..., : self.h], T[..., self.h :]

    def of(self, g: Tensor) -> Tensor:
        """``[M | x]^T g``: ``M^T g`` on top of ``x^T g``, ``(..., 2h, h)``."""
        if self.both is None:
            return torch.cat([mm(self.M.mT, g), mm(self.x.mT, g)], dim=-2)
        return mm(self.both.mT, g)


def _into(out: Tensor | None, like: Tensor) -> Tensor | None:
    """``out`` if it can be written (contiguous, of ``like``'s shape), else None."""
    return out if out is not None and out.shape == like.shape and out.is_contiguous() else None


def _invariant_factor(
    M: Tensor, xi: Tensor, eps: float, start: Tensor, alpha: float, out: Tensor | None = None
) -> tuple[Tensor, Callable]:
    """One decoupled factor of the invariant metric: ``start + alpha Gamma`` and the step's VJP.

    ``Gamma = -xi P^{-1} S + M P^{-1} xi^T xi`` with ``S = xi^T M + M^T xi`` and
    ``P = M^T M + s I``; the VJP returns ``g - (d/dv Gamma(xi, xi)/2 [v])^T g``.
    """
    P = Gram.of(M, eps)
    cross = _Cross(xi, M)
    h = M.shape[-1]
    Z = P.solve(torch.cat([_sym(cross.xM), cross.xx], dim=-1))
    gamma = addmm(start, xi, Z[..., :h], -alpha, out=_into(out, start))
    addmm(gamma, M, Z[..., h:], alpha, out=gamma)

    def vjp(g: Tensor, out: Tensor | None = None) -> Tensor:
        T = cross.of(g)  # M^T g on top of xi^T g
        W = P.solve(torch.cat([T[..., h:, :], T[..., :h, :]], dim=-1))  # P^-1 xi^T g, P^-1 M^T g
        # g + (g Z1^T + M sym(W1) - xi sym(W2)) / 2, with S P^-1 = (P^-1 S)^T (both symmetric)
        pulled = addmm(g, g, Z[..., :h].mT, 0.5, out=_into(out, g))
        addmm(pulled, M, _sym(W[..., :h]), 0.5, out=pulled)
        return addmm(pulled, xi, _sym(W[..., h:]), -0.5, out=pulled)

    return gamma, vjp


def _mixed(
    block: Pair, xi: Pair, eps: float, start: Pair, alpha: float, out: Pair | None = None
) -> tuple[Pair, Callable]:
    """``start + alpha Gamma(xi, xi)`` of the mixed metric and the step's VJP (G, H coupled)."""
    (G, H), (xG, xH) = block, xi
    P, Q = Gram.of(G, eps), Gram.of(H, eps)
    cG, cH = _Cross(xG, G), _Cross(xH, H)
    h = G.shape[-1]
    # S P^-1 on top of (xi^T xi) P^-1, one product per factor (and S Q^-1, ... for H)
    AB_G = P.solve(torch.cat([_sym(cG.xM), cG.xx], dim=-2), left=False)
    AB_H = Q.solve(torch.cat([_sym(cH.xM), cH.xx], dim=-2), left=False)
    A_G, A_H = AB_G[..., :h, :], AB_H[..., :h, :]
    oG, oH = (None, None) if out is None else (_into(out.G, xG), _into(out.H, xH))
    gamma = Pair(addmm(start.G, xG, A_H, alpha, out=oG), addmm(start.H, xH, A_G, alpha, out=oH))
    addmm(gamma.G, G, AB_H[..., h:, :], -alpha, out=gamma.G)
    addmm(gamma.H, H, AB_G[..., h:, :], -alpha, out=gamma.H)

    def vjp(g: Pair, out: Pair | None = None) -> Pair:
        gG, gH = g
        oG, oH = (None, None) if out is None else (_into(out.G, gG), _into(out.H, gH))
        # with t_G = g_G Q^-1, t_H = g_H P^-1: M = xi^T t and N = (G or H)^T t
        NM_G, NM_H = Q.solve(cG.of(gG), left=False), P.solve(cH.of(gH), left=False)
        N_G, M_G, N_H, M_H = NM_G[..., :h, :], NM_G[..., h:, :], NM_H[..., :h, :], NM_H[..., h:, :]
        # g - (g A^T + (G or H) sym(M) - xi sym(N)) / 2, with Q^-1 S_H = (S_H Q^-1)^T
        pG = addmm(gG, gG, A_H.mT, -0.5, out=oG)
        addmm(addmm(pG, G, _sym(M_H), -0.5, out=pG), xG, _sym(N_H), 0.5, out=pG)
        pH = addmm(gH, gH, A_G.mT, -0.5, out=oH)
        addmm(addmm(pH, H, _sym(M_G), -0.5, out=pH), xH, _sym(N_G), 0.5, out=pH)
        return Pair(pG, pH)

    return gamma, vjp


def _linearized(
    block: Pair, xi: Pair, metric: str, eps: float, step: bool = False, out: Pair | None = None
) -> tuple[Pair, Callable]:
    """``Gamma(xi, xi)`` (or, with ``step``, the step ``xi - Gamma(xi, xi) / 2``) and its VJP.

    The two share their products with ``xi`` (computed once), which is what an
    ascent needs at every step: the moved point, then the pullback of its gradient.
    ``out``: a pair to write the step into (with ``step``); the VJP takes one too.
    """
    metric = check_metric(metric)
    if metric == "euclidean":
        if not step:
            gamma = Pair(*map(torch.zeros_like, xi))
        elif out is None:
            gamma = Pair(*(x.clone() for x in xi))
        else:
            gamma = Pair(*(o.copy_(x) for o, x in zip(out, xi, strict=True)))
        return gamma, lambda g, out=None: Pair(*g)
    start, alpha = (xi, -0.5) if step else (Pair(*map(torch.zeros_like, xi)), 1.0)
    out = out if step else None
    if metric == "mixed":
        return _mixed(block, xi, eps, start, alpha, out)
    gamma_G, vjp_G = _invariant_factor(block.G, xi.G, eps, start.G, alpha, out and out.G)
    gamma_H, vjp_H = _invariant_factor(block.H, xi.H, eps, start.H, alpha, out and out.H)

    def vjp(g: Pair, out: Pair | None = None) -> Pair:
        return Pair(vjp_G(g[0], out and out[0]), vjp_H(g[1], out and out[1]))

    return Pair(gamma_G, gamma_H), vjp


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
    return _linearized(as_pair(block), as_pair(xi), metric, eps)[0]


def geodesic_step(
    block: Pair | tuple[Tensor, Tensor],
    xi: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    eps: float = DEFAULT_EPS,
) -> Pair:
    """Second-order approximation ``theta + xi - 1/2 Gamma(xi, xi)`` of ``exp_theta(xi)``.

    Pass a horizontal ``xi`` (:func:`~wsym.sharpness.geometry.horizontal`) to move on the
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
    return _linearized(as_pair(block), as_pair(xi), metric, eps)[1](as_pair(cotangent))


def geodesic_step_linearized(
    block: Pair | tuple[Tensor, Tensor],
    xi: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    eps: float = DEFAULT_EPS,
    out: Pair | None = None,
) -> tuple[Pair, Callable[..., Pair]]:
    """The displacement ``xi - Gamma(xi, xi) / 2`` of :func:`geodesic_step` and its VJP.

    One call gives what :func:`geodesic_step` and :func:`geodesic_step_vjp` give
    separately, sharing their products with ``xi``.

    Args:
        block: G ``(..., n, h)``, H ``(..., m, h)``.
        xi: tangent vector of the same shapes.
        metric: ``"euclidean"``, ``"invariant"`` or ``"mixed"``.
        eps: Gram regularization; 0 for exact formulas.
        out: a pair of contiguous tensors shaped like ``xi`` to write the displacement
            into (it must not be ``xi``); default new tensors.

    Returns:
        ``(displacement, vjp)``: the new block is ``block + displacement``; ``vjp``
        maps a cotangent at the new block to ``(dL/dxi_G, dL/dxi_H)`` (``vjp(g, out)``
        writes it into the pair ``out``).

    Example:
        >>> G, H = torch.randn(4, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
        >>> xi = (0.1 * torch.randn_like(G), 0.1 * torch.randn_like(H))
        >>> move, vjp = geodesic_step_linearized((G, H), xi, "invariant")
        >>> torch.allclose(G + move.G, geodesic_step((G, H), xi, "invariant").G)
        True
    """
    return _linearized(as_pair(block), as_pair(xi), metric, eps, step=True, out=out)
