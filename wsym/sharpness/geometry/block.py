"""GL blocks, their tangent vectors, the group action and regularized Gram matrices.

A GL block is a pair ``(G, H)`` with ``G`` of shape ``(..., n, h)`` and ``H`` of
shape ``(..., m, h)`` that a network uses only through ``G H^T``; leading dims
index independent blocks (one per attention head). ``GL(h)`` acts as

    (G, H) -> (G A^{-1}, H A^T),

and, being linear, acts on tangent vectors ``(xi_G, xi_H)`` in the same way. The
orbit through ``(G, H)`` has tangent (vertical) space ``{(-G Omega, H Omega^T)}``.

Gram matrices are regularized as ``P = G^T G + s I`` with the shift
``s = eps * Tr(G^T G) / h`` (``eps`` relative to the mean eigenvalue; ``s = eps``
for an all-zero factor), so that rank-deficient blocks never produce NaN. The
shift is computed once at the base point and treated as a constant. ``eps = 0``
gives the exact formulas (and inf/NaN on singular blocks).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, NamedTuple

import torch
from torch import Tensor

DEFAULT_EPS = 1e-10
"""Default Gram regularization, relative to the mean eigenvalue of ``G^T G``."""

Metric = Literal["euclidean", "invariant", "mixed"]
METRICS: tuple[str, ...] = ("euclidean", "invariant", "mixed")


class Pair(NamedTuple):
    """A GL block ``(G, H)`` or a tangent vector ``(xi_G, xi_H)`` at one.

    Shapes:
        G: ``(..., n, h)``; H: ``(..., m, h)`` with the same leading dims.

    Example:
        >>> G, H = Pair(torch.ones(3, 2), torch.ones(4, 2))
        >>> (G @ H.mT).shape
        torch.Size([3, 4])
    """

    G: Tensor
    H: Tensor


def as_pair(x: Pair | tuple[Tensor, Tensor]) -> Pair:
    """Convert a ``(G, H)`` tuple to a :class:`Pair`, checking the shapes agree."""
    G, H = x
    if G.ndim < 2 or H.ndim < 2 or G.shape[-1] != H.shape[-1]:
        raise ValueError(f"expected G (..., n, h) and H (..., m, h), got {G.shape}, {H.shape}")
    if G.shape[:-2] != H.shape[:-2]:
        raise ValueError(f"G and H leading dims differ: {G.shape[:-2]} vs {H.shape[:-2]}")
    return Pair(G, H)


def check_metric(metric: str) -> str:
    """Return ``metric`` if it names a GL-block metric, else raise ``ValueError``."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {METRICS}")
    return metric


def act(x: Pair | tuple[Tensor, Tensor], A: Tensor) -> Pair:
    """The ``GL(h)`` action ``(G, H) -> (G A^{-1}, H A^T)`` (also on tangent vectors).

    Args:
        x: block or tangent vector, G ``(..., n, h)``, H ``(..., m, h)``.
        A: invertible ``(..., h, h)``, broadcast over the leading dims.

    Example:
        >>> G, H, A = torch.randn(3, 2), torch.randn(4, 2), torch.randn(2, 2) + 3 * torch.eye(2)
        >>> G2, H2 = act((G, H), A)
        >>> torch.allclose(G2 @ H2.mT, G @ H.mT, atol=1e-5)
        True
    """
    G, H = as_pair(x)
    G_new = torch.linalg.solve(A, G, left=False)
    return Pair(G_new, H @ A.mT)


def vertical(block: Pair | tuple[Tensor, Tensor], omega: Tensor) -> Pair:
    """The vertical (orbit-tangent) vector ``(-G Omega, H Omega^T)``.

    It is the velocity of ``t -> act(block, I + t Omega)`` at ``t = 0``.

    Args:
        block: G ``(..., n, h)``, H ``(..., m, h)``.
        omega: ``(..., h, h)``.
    """
    G, H = as_pair(block)
    return Pair(-G @ omega, H @ omega.mT)


def mm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b``, as broadcast products where a dimension of the product is 1.

    GL(1) blocks (``h = 1``, one per scaling unit, stacked by the thousand) make every
    product of the geometry an outer product ``(n, 1) @ (1, k)`` or a dot product
    ``(1, n) @ (n, 1)``; batched matrix multiplication of such shapes costs many
    times the elementwise products it amounts to.

    Example:
        >>> a, b, c = torch.randn(5, 3, 1), torch.randn(5, 1, 4), torch.randn(5, 1, 3)
        >>> torch.allclose(mm(a, b), a @ b) and torch.allclose(mm(c, a), c @ a)
        True
    """
    if a.shape[-1] == 1:
        return a * b
    if a.shape[-2] == 1 and b.shape[-1] == 1:
        return (a.mT * b).sum(-2, keepdim=True)
    return a @ b


def addmm(c: Tensor, a: Tensor, b: Tensor, alpha: float = 1.0, out: Tensor | None = None) -> Tensor:
    """``c + alpha * (a @ b)`` in one pass (no product temporary), shapes as for :func:`mm`.

    ``out``: a contiguous tensor of the result's shape to write into; it may be ``c``
    itself (then ``c`` is updated in place). Batched operands with equal leading dims
    use ``baddbmm``; a product with ``h = 1`` is a broadcast ``addcmul``.

    Example:
        >>> a, b, c = torch.randn(2, 5, 3), torch.randn(2, 3, 4), torch.randn(2, 5, 4)
        >>> torch.allclose(addmm(c, a, b, -0.5), c - 0.5 * (a @ b))
        True
    """
    if a.shape[-1] == 1:
        if out is c:
            return c.addcmul_(a, b, value=alpha)
        return torch.addcmul(c, a, b, value=alpha, out=out)
    flat = (
        a.ndim == b.ndim == c.ndim >= 3
        and a.shape[:-2] == b.shape[:-2] == c.shape[:-2]
        and (out is None or out.is_contiguous())
        and not (a.shape[-2] == 1 and b.shape[-1] == 1)
    )
    if flat:
        a3, b3 = a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:])
        c3 = c.reshape(-1, *c.shape[-2:])
        if out is None:
            return torch.baddbmm(c3, a3, b3, alpha=alpha).view(c.shape)
        if out is c:
            c3.baddbmm_(a3, b3, alpha=alpha)
            return c
        torch.baddbmm(c3, a3, b3, alpha=alpha, out=out.view(c3.shape))
        return out
    if a.ndim == b.ndim == c.ndim == 2 and (out is None or out.is_contiguous()):
        if out is c:
            return c.addmm_(a, b, alpha=alpha)
        return torch.addmm(c, a, b, alpha=alpha, out=out)
    value = c + alpha * mm(a, b)
    return value if out is None else out.copy_(value)


#: ``id(M) -> (weak reference to M, (eps, version), Gram)`` (see :meth:`Gram.of`).
_GRAMS: dict[int, tuple] = {}


def _shift(gram: Tensor, eps: float) -> Tensor:
    """Regularization shift ``eps * Tr(gram) / h`` (``eps`` when the trace is 0)."""
    mean = gram.diagonal(dim1=-2, dim2=-1).mean(-1)
    return torch.where(mean > 0, eps * mean, torch.full_like(mean, eps))


@dataclass(frozen=True)
class Gram:
    """Regularized Gram matrix ``P = M^T M + s I`` of one factor ``M`` ``(..., k, h)``.

    Attributes:
        raw: ``M^T M``, shape ``(..., h, h)``.
        shift: ``s``, shape ``(...)``.
    """

    raw: Tensor
    shift: Tensor

    @classmethod
    def of(cls, M: Tensor, eps: float = DEFAULT_EPS) -> Gram:
        """Gram matrix of ``M`` with the relative shift of the module docstring.

        Remembered per tensor (while it lives and is not modified in place) when
        ``M`` carries no autograd graph: an ascent at a fixed base point asks for
        the same block's Gram matrix, and its factorization, at every step.
        """
        key = (eps, M._version)
        hit = _GRAMS.get(id(M))
        if hit is not None and hit[0]() is M and hit[1] == key:
            return hit[2]
        raw = mm(M.mT, M)
        gram = cls(raw, _shift(raw, eps))
        if not M.requires_grad:
            ident = id(M)
            _GRAMS[ident] = (weakref.ref(M, lambda _: _GRAMS.pop(ident, None)), key, gram)
        return gram

    @cached_property
    def matrix(self) -> Tensor:
        """``P = M^T M + s I``."""
        eye = torch.eye(self.raw.shape[-1], dtype=self.raw.dtype, device=self.raw.device)
        return self.raw + self.shift[..., None, None] * eye

    @cached_property
    def inverse(self) -> Tensor | None:
        """``P^{-1}`` from the Cholesky factor of ``P``; None where ``P`` is not numerically PD."""
        factor, info = torch.linalg.cholesky_ex(self.matrix)
        return None if bool(info.any()) else torch.cholesky_inverse(factor)

    def solve(self, X: Tensor, left: bool = True) -> Tensor:
        """``P^{-1} X`` (or ``X P^{-1}`` with ``left=False``); inf/NaN if ``P`` is singular.

        A product with the inverse (computed once per base point from the Cholesky
        factor: an ascent solves with the same few small matrices many times), or an
        LU solve where ``P`` is not numerically positive definite (``eps = 0`` on a
        singular block).
        """
        inv = self.inverse
        if inv is None:
            return torch.linalg.solve_ex(self.matrix, X, left=left)[0]
        return mm(inv, X) if left else mm(X, inv)

    def eigh(self) -> tuple[Tensor, Tensor]:
        """Eigenvalues ``p`` (of ``M^T M``, clamped at 0) and orthonormal eigenvectors ``U``."""
        return self._eigh

    @cached_property
    def _eigh(self) -> tuple[Tensor, Tensor]:
        if not bool(torch.isfinite(self.raw).all()):  # a diverged step: NaN, not an exception
            nan = torch.full_like(self.raw, float("nan"))
            return nan[..., 0], nan
        p, U = torch.linalg.eigh(self.raw)
        return p.clamp_min(0), U

    def memo(self, other: Tensor, name: str, compute):
        """``compute()``, remembered on this Gram matrix per (``name``, other factor ``other``).

        For quantities of a block that depend on both factors (the invariant metric's
        joint eigenbases): computed once per base point, like the Gram matrix itself.
        Not remembered when ``other`` carries an autograd graph.
        """
        if other.requires_grad:
            return compute()
        memo = self.__dict__.setdefault("_memo", {})
        hit = memo.get((name, id(other)))
        if hit is not None and hit[0]() is other and hit[1] == other._version:
            return hit[2]
        value = compute()
        memo[(name, id(other))] = (weakref.ref(other), other._version, value)
        return value
