r"""Horizontal projection: remove from a tangent vector its component along the orbit.

The vertical space at ``(G, H)`` is ``{(-G Omega, H Omega^T)}``. The horizontal
projection of ``xi`` is ``(xi_G + G Lambda, xi_H - H Lambda^T)`` with ``Lambda``
chosen so that the result is metric-orthogonal to every vertical vector. Writing
``P0 = G^T G``, ``Q0 = H^T H`` and ``P = P0 + s_G I``, ``Q = Q0 + s_H I`` for the
regularized Gram matrices of the metric, that condition reads, for each metric:

* euclidean: ``P0 Lambda + Lambda Q0 = xi_H^T H - G^T xi_G``;
* invariant (``X = Lambda^T``): ``(P Q0) X + X (P0 Q) = P H^T xi_H - xi_G^T G Q``,
  which at ``eps = 0`` is the Sylvester equation ``A X + X A = B`` with
  ``A = G^T G H^T H`` and ``B = G^T G H^T xi_H - xi_G^T G H^T H``;
* mixed: ``P0 Lambda Q + P Lambda Q0 = P xi_H^T H - G^T xi_G Q``, which at
  ``eps = 0`` has the closed form
  ``Lambda = 1/2 [xi_H^T H Q^{-1} - P^{-1} G^T xi_G]``.

(Derivation: ``<xi + vertical(-Lambda), vertical(Omega)> = Tr[Omega^T M(Lambda)]``
for all ``Omega``, so ``M(Lambda) = 0``; then multiply out the inverses.)

All three are solved exactly (to round-off) for the regularized metric, in
eigenbases: ``P0`` and ``P`` share eigenvectors, as do ``Q0`` and ``Q``, and the
invariant case is similar to a diagonal one through ``P^{1/2} Q0 P^{1/2}`` and
``Q^{1/2} P0 Q^{1/2}`` (both symmetric PSD, so every step is a symmetric
eigendecomposition). Where a denominator vanishes (``G`` and ``H`` both rank
deficient along the same vertical direction, which is then the zero vector) the
coefficient is set to 0, as a pseudo-inverse would.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wsym.sharpness.geometry.block import DEFAULT_EPS, Gram, Metric, Pair, as_pair, check_metric


def _pinv_reciprocal(den: Tensor) -> Tensor:
    """``1 / den`` elementwise, 0 where ``den`` is negligible against its maximum."""
    h = den.shape[-1]
    tol = h * torch.finfo(den.dtype).eps * den.amax((-2, -1), keepdim=True)
    ok = den > tol
    return torch.where(ok, 1 / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(den))


def _sym_power(p: Tensor, U: Tensor, power: float) -> Tensor:
    """``U diag(p^power) U^T`` for eigenvalues ``p`` ``(..., h)`` and eigenvectors ``U``."""
    return (U * p.pow(power)[..., None, :]) @ U.mT


def _lambda_euclidean(G: Tensor, H: Tensor, xG: Tensor, xH: Tensor) -> Tensor:
    P, Q = Gram.of(G, 0.0), Gram.of(H, 0.0)
    (_, U), (_, V), recip = P.memo(H, "euclidean", lambda: _euclidean_basis(P, Q))
    C = U.mT @ (xH.mT @ H - G.mT @ xG) @ V
    return U @ (C * recip) @ V.mT


def _euclidean_basis(P: Gram, Q: Gram) -> tuple:
    (p, U), (q, V) = P.eigh(), Q.eigh()
    return (p, U), (q, V), _pinv_reciprocal(p[..., :, None] + q[..., None, :])


def _lambda_mixed(G: Tensor, H: Tensor, xG: Tensor, xH: Tensor, eps: float) -> Tensor:
    P, Q = Gram.of(G, eps), Gram.of(H, eps)
    U, V, pe, qe, recip = P.memo(H, "mixed", lambda: _mixed_basis(P, Q))
    C = pe[..., :, None] * (U.mT @ (xH.mT @ H) @ V) - (U.mT @ (G.mT @ xG) @ V) * qe[..., None, :]
    return U @ (C * recip) @ V.mT


def _mixed_basis(P: Gram, Q: Gram) -> tuple:
    """Base-point factors of the mixed solve (they do not depend on ``xi``)."""
    (p, U), (q, V) = P.eigh(), Q.eigh()
    pe, qe = p + P.shift[..., None], q + Q.shift[..., None]
    den = p[..., :, None] * qe[..., None, :] + pe[..., :, None] * q[..., None, :]
    return U, V, pe, qe, _pinv_reciprocal(den)


def _invariant_basis(P: Gram, Q: Gram) -> tuple[Tensor, ...]:
    """Base-point factors of the invariant Sylvester solve (they do not depend on ``xi``)."""
    (p, U), (q, V) = P.eigh(), Q.eigh()
    pe, qe = p + P.shift[..., None], q + Q.shift[..., None]
    P_half, P_mhalf = _sym_power(pe, U, 0.5), _sym_power(pe, U, -0.5)
    Q_half, Q_mhalf = _sym_power(qe, V, 0.5), _sym_power(qe, V, -0.5)
    # P Q0 = P^{1/2} S1 P^{-1/2}, P0 Q = Q^{-1/2} S2 Q^{1/2}, S1 = W1 D1 W1^T, S2 = W2 D2 W2^T
    S1 = P_half @ Q.raw @ P_half
    S2 = Q_half @ P.raw @ Q_half
    d1, W1 = torch.linalg.eigh((S1 + S1.mT) / 2)
    d2, W2 = torch.linalg.eigh((S2 + S2.mT) / 2)
    den = d1.clamp_min(0)[..., :, None] + d2.clamp_min(0)[..., None, :]
    return P_half @ W1, P_mhalf @ W1, Q_half @ W2, Q_mhalf @ W2, _pinv_reciprocal(den)


def _lambda_invariant(G: Tensor, H: Tensor, xG: Tensor, xH: Tensor, eps: float) -> Tensor:
    P, Q = Gram.of(G, eps), Gram.of(H, eps)
    PW, PmW, QW, QmW, recip = P.memo(H, "invariant", lambda: _invariant_basis(P, Q))
    # W1^T P^{-1/2} B Q^{-1/2} W2 with B = P H^T xi_H - xi_G^T G Q (no cancelled powers)
    C = PW.mT @ (H.mT @ xH) @ QmW - PmW.mT @ (xG.mT @ G) @ QW
    X = PW @ (C * recip) @ QW.mT
    return X.mT


def horizontal_lambda(
    block: Pair | tuple[Tensor, Tensor],
    xi: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    eps: float = DEFAULT_EPS,
) -> Tensor:
    """The ``Lambda`` with ``horizontal(xi) = (xi_G + G Lambda, xi_H - H Lambda^T)``.

    Args:
        block: G ``(..., n, h)``, H ``(..., m, h)``.
        xi: tangent vector of the same shapes.
        metric: ``"euclidean"``, ``"invariant"`` or ``"mixed"``.
        eps: Gram regularization (see :mod:`wsym.sharpness.geometry.block`); 0 for exact formulas.

    Returns:
        ``Lambda`` of shape ``(..., h, h)`` solving the equation in the module docstring.

    Example:
        >>> G, H = torch.randn(4, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
        >>> xG, xH = torch.randn_like(G), torch.randn_like(H)
        >>> lam = horizontal_lambda((G, H), (xG, xH), "mixed", eps=0)
        >>> P, Q = G.T @ G, H.T @ H
        >>> closed = 0.5 * (xH.T @ H @ torch.linalg.inv(Q) - torch.linalg.inv(P) @ G.T @ xG)
        >>> torch.allclose(lam, closed)
        True
    """
    G, H = as_pair(block)
    xG, xH = as_pair(xi)
    metric = check_metric(metric)
    if metric == "euclidean":
        return _lambda_euclidean(G, H, xG, xH)
    if metric == "mixed":
        return _lambda_mixed(G, H, xG, xH, eps)
    return _lambda_invariant(G, H, xG, xH, eps)


def horizontal(
    block: Pair | tuple[Tensor, Tensor],
    xi: Pair | tuple[Tensor, Tensor],
    metric: Metric = "invariant",
    eps: float = DEFAULT_EPS,
) -> Pair:
    """Metric-orthogonal projection of ``xi`` onto the horizontal space at ``block``.

    Returns ``(xi_G + G Lambda, xi_H - H Lambda^T)`` with ``Lambda`` from
    :func:`horizontal_lambda`; the result is orthogonal, in ``metric`` with the same
    ``eps``, to every vertical vector ``(-G Omega, H Omega^T)``.

    Args:
        block: G ``(..., n, h)``, H ``(..., m, h)``.
        xi: tangent vector of the same shapes.
        metric: ``"euclidean"``, ``"invariant"`` or ``"mixed"``.
        eps: Gram regularization; 0 for the exact formulas.

    Returns:
        The horizontal tangent vector, a :class:`Pair` of the shapes of ``xi``.

    Example:
        >>> from wsym.sharpness.geometry import inner, vertical
        >>> G, H = torch.randn(5, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
        >>> xi = horizontal((G, H), (torch.randn_like(G), torch.randn_like(H)))
        >>> v = vertical((G, H), torch.randn(3, 3, dtype=torch.float64))
        >>> abs(float(inner((G, H), xi, v))) < 1e-8
        True
    """
    G, H = as_pair(block)
    xG, xH = as_pair(xi)
    lam = horizontal_lambda((G, H), (xG, xH), metric, eps)
    return Pair(xG + G @ lam, xH - H @ lam.mT)
