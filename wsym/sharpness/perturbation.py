"""Perturbation geometries of :func:`wsym.sharpness.sharpness`: tangents, metrics, moved points.

A :class:`Perturbation` holds a base point (a parameter dict) and defines, for a
tangent vector ``xi`` (a list of tensors), its metric inner product, the
Riemannian gradient from a Euclidean one, random directions and the moved point
``gamma_xi(1)`` with the pullback of gradients there (:meth:`Perturbation.linearize`):

* :class:`Euclidean`: ``theta + xi`` with ``|xi|_2``;
* :class:`Adaptive`: ``theta + xi`` with the elementwise metric ``|xi / w|_2``;
* :class:`Geodesic`: on the GL and GL(1) blocks of :class:`wsym.sharpness.quotient.Quotient`
  (stacked), horizontal tangents in the invariant or mixed metric moved by the
  second-order geodesic step; adaptive elsewhere.

Example:
    >>> import torch
    >>> params = {"w": torch.tensor([1.0, -2.0], dtype=torch.float64)}
    >>> geom = Adaptive(params)
    >>> round(float(geom.norm([torch.tensor([0.5, 1.0], dtype=torch.float64)])), 12)  # |(.5, -.5)|
    0.707106781187
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from wsym.group.spec import SymmetrySpec
from wsym.sharpness import tangent
from wsym.sharpness.geometry import (
    Gram,
    Pair,
    geodesic_step_linearized,
    inner,
    riemannian_gradient,
)
from wsym.sharpness.geometry.metrics import _elementwise_shift
from wsym.sharpness.quotient import Quotient
from wsym.sharpness.tangent import FlatTangent, Pool
from wsym.sharpness.vertical import Horizontal

EPS = 1e-14
"""GL Gram regularization (relative to the mean eigenvalue): finite on singular blocks.

The shift ``s I`` is invariant only to O(h); the measures evaluate at a GL-balanced point,
where that is all that remains of the group (``docs/geometry.md``, section 2.1)."""
ELEMENTWISE_EPS = 1e-20
"""Adaptive-metric shift (relative to mean w^2): tiny, so rescalings by 1e4 stay exact."""

Tangent = list[Tensor]


class Perturbation:
    """Tangent vectors at ``params``: their metric, gradients, random draws and the moved point.

    Subclasses implement :meth:`inner` and :meth:`gradient` (and override
    :meth:`point` / :meth:`random` where the step is not straight). A tangent is a
    list of tensors shaped like :meth:`coordinates`: one per parameter in
    :attr:`slots` (every parameter unless a subclass moves some otherwise).
    """

    def __init__(self, params: dict[str, Tensor]):
        self.params = params
        self.names = list(params)
        self.slots = self.names

    def zero(self) -> Tangent:
        """The zero tangent vector."""
        return [torch.zeros_like(t) for t in self.coordinates()]

    def coordinates(self) -> list[Tensor]:
        """The base point in tangent layout (one tensor per slot)."""
        return [self.params[n] for n in self.slots]

    def inner(self, a: Tangent, b: Tangent) -> Tensor:
        """Metric inner product (0-dim)."""
        raise NotImplementedError

    def gradient(self, g: Tangent) -> Tangent:
        """Riemannian gradient from the Euclidean gradient with respect to the tangent."""
        raise NotImplementedError

    def norm(self, xi: Tangent) -> Tensor:
        """Metric norm (0-dim)."""
        return self.inner(xi, xi).clamp_min(0).sqrt()

    def gradient_norm(self, g: Tangent, d: Tangent) -> Tensor:
        """Metric norm of the Riemannian gradient ``d = gradient(g)`` (0-dim).

        ``|d|^2 = <g, d>`` in Euclidean coordinates (``d = M^{-1} g``, and where ``d``
        is projected, the projection is metric-orthogonal), which subclasses use to
        avoid a metric product.
        """
        return self.norm(d)

    def point(self, xi: Tangent) -> dict[str, Tensor]:
        """Perturbed parameters (straight step ``theta + xi``)."""
        moved = {n: self.params[n] + x for n, x in zip(self.slots, xi, strict=False)}
        return moved if len(moved) == len(self.params) else {**self.params, **moved}

    def linearize(self, xi: Tangent) -> tuple[dict[str, Tensor], Callable]:
        """``point(xi)`` (no graph) and the pullback of gradients there to gradients in ``xi``.

        The pullback maps the gradient of a function at ``point(xi)`` (one tensor per
        parameter, :attr:`names` order) through the transposed Jacobian of
        :meth:`point` (the identity for a straight step), so the ascent
        differentiates the network with respect to its parameters only.
        """
        with torch.no_grad():
            return self.point(xi), list

    def spare(self) -> Tangent | None:
        """A tangent to overwrite (recycled by :meth:`release`), or None (none kept)."""
        return None

    def release(self, xi: Tangent) -> None:
        """``xi`` is read no more (by anyone): its storage may be recycled."""

    def random(self, gen: torch.Generator) -> Tangent:
        """A random direction (Euclidean Gaussian)."""
        return [_randn(t, gen) for t in self.coordinates()]


def _randn(like: Tensor, gen: torch.Generator, shape=None) -> Tensor:
    shape = like.shape if shape is None else shape
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(like.device, like.dtype)


class Euclidean(Perturbation):
    """``||xi||_2``: no invariance."""

    def inner(self, a, b):
        """Metric inner product (0-dim)."""
        return sum((x * y).sum() for x, y in zip(a, b, strict=True))

    def gradient(self, g):
        """Riemannian gradient from the Euclidean one."""
        return list(g)


class Adaptive(Perturbation):
    """Elementwise adaptive metric ``||xi / |w| ||_2`` (ASAM); ``mask`` zeroes covered entries.

    The metric weights ``w^2 + s`` (:func:`wsym.sharpness.geometry.adaptive_inner`) are computed
    once at the base point and the tangent is handled as one flat vector where that
    saves per-tensor work.
    """

    def __init__(self, params, mask: dict[str, Tensor] | None = None):
        super().__init__(params)
        mask = mask or {}
        # a parameter that the mask covers entirely has no slot (nothing to measure)
        self.slots = [n for n in self.names if n not in mask or not bool(mask[n].all())]
        dens, keeps = [], []
        for n in self.slots:
            w = self.params[n]
            dens.append((w * w + _elementwise_shift(w, ELEMENTWISE_EPS)).reshape(-1))
            k = ~mask[n] if n in mask else None
            keeps.append(torch.ones_like(dens[-1]) if k is None else k.reshape(-1).to(w.dtype))
        keep = torch.cat(keeps) if keeps else torch.zeros(0)
        den = torch.cat(dens) if dens else torch.zeros(0)
        self._inv = keep / den  # metric weight, 0 on covered entries
        self._scale = keep * den  # Riemannian-gradient factor
        self._keep = keep
        # per slot: None where no entry is covered (nothing to mask), else the mask
        self._partial = [
            (~mask[n]).to(self.params[n].dtype) if n in mask and bool(mask[n].any()) else None
            for n in self.slots
        ]
        self._shapes = [self.params[n].shape for n in self.slots]
        self._sizes = [self.params[n].numel() for n in self.slots]
        self._slot_total = sum(self._sizes)

    def _flat(self, xs) -> Tensor:
        buffer = getattr(xs, "flat", None)
        if buffer is not None:  # a flat tangent: its plain entries lead
            return buffer[: self._slot_total]
        return torch.cat([x.reshape(-1) for x in xs[: len(self.slots)]])

    def _split(self, flat: Tensor) -> list[Tensor]:
        parts = flat.split(self._sizes)
        return [x.reshape(s) for x, s in zip(parts, self._shapes, strict=True)]

    def _masked(self, xs):
        return [x if k is None else x * k for x, k in zip(xs, self._partial, strict=False)]

    def inner(self, a, b):
        """Metric inner product (0-dim)."""
        if not self.slots:
            return torch.zeros((), dtype=torch.float64)
        fa = self._flat(a)
        return torch.dot(fa * self._inv, fa if b is a else self._flat(b))

    def gradient(self, g):
        """Riemannian gradient from the Euclidean one."""
        return self._split(self._flat(g) * self._scale) if self.slots else []

    def random(self, gen):
        """A random direction in the metric's coordinates (equivariant draw)."""
        # every parameter draws, slot or not, so that the stream does not depend on the mask;
        # w * z (not |w| * z): a sign flip of w flips the draw, as it flips the tangent
        z = {n: _randn(self.params[n], gen) for n in self.names}
        return self._masked([self.params[n] * z[n] for n in self.slots])


class Geodesic(Adaptive):
    """The quotient by the whole continuous group: horizontal tangents, block metrics, geodesics.

    GL, orthogonal and GL(1) blocks (:class:`wsym.sharpness.quotient.Quotient`) use the invariant
    or mixed metric and the second-order geodesic step (orthogonal groups, which have
    no pair of factors, always the invariant metric); every other entry uses the
    elementwise adaptive metric and a straight step. Tangent vectors are projected on
    the horizontal space of *every* continuous group of the spec
    (:class:`wsym.sharpness.vertical.Horizontal`): blocks, the other scaling groups,
    LayerNorm input scalings and translations, overlapping or not. The metric is
    invariant to the whole group at a point balanced by :mod:`wsym.sharpness.gauge`
    (see ``docs/geometry.md``).
    """

    def __init__(self, params, spec: SymmetrySpec, metric: str):
        quotient = Quotient(spec, params)
        super().__init__(params, quotient.covered)
        self.quotient, self.metric, self.eps = quotient, metric, EPS
        self.blocks = quotient.stacks  # equal-shape blocks stacked: one solve per stack
        self.metrics = [self.stack_metric(s) for s in range(len(self.blocks))]
        touched = [params[n].reshape(-1) for n in quotient.touched]
        self._touched_flat = torch.cat(touched) if touched else None  # base of the block moves
        self._all_sizes = [params[n].numel() for n in self.names]
        self._all_shapes = [params[n].shape for n in self.names]
        self._tangent_shapes = [t.shape for t in self.coordinates()]
        self._total = sum(s.numel() for s in self._tangent_shapes)
        like = next(iter(params.values()), torch.zeros(0, dtype=torch.float64))
        self._pool = Pool(self._total, like)
        self._masks_slots = bool((self._keep != 1).any())  # some slot entry inside a block
        self.horizontal = Horizontal(self, spec)

    def stack_metric(self, s: int) -> str:
        """The metric of stack ``s``: the chosen one, or invariant for orthogonal groups."""
        return "invariant" if self.quotient.orthogonal[s] else self.metric

    def coordinates(self):
        """Parameters not inside the blocks entirely, then the GL blocks' G and H."""
        return super().coordinates() + [m for b in self.blocks for m in b]

    def zero(self):
        """The zero tangent vector (flat, :class:`wsym.sharpness.tangent.FlatTangent`)."""
        return self._tangent(self._pool.take().zero_())

    def spare(self):
        """A flat tangent to overwrite (contents undefined): recycled where one was released."""
        return self._tangent(self._pool.take())

    def release(self, xi):
        """Recycle the buffer of a flat tangent that nothing reads any more."""
        self._pool.give(xi)

    def _tangent(self, flat: Tensor) -> FlatTangent:
        """Tangent-layout views of a flat vector."""
        return FlatTangent.of(flat, self._tangent_shapes)

    def _pairs(self, xi) -> list[Pair]:
        rest = xi[len(self.slots) :]
        return [Pair(rest[2 * j], rest[2 * j + 1]) for j in range(len(self.blocks))]

    # -- tangent layout <-> flat parameter vectors (one partition, so each is the other's
    # -- inverse and Euclidean adjoint)
    def to_tangent(self, flat: Tensor) -> Tangent:
        """A flat vector over all parameters (:attr:`names` order) in tangent layout."""
        parts = flat.split(self._all_sizes)
        table = {n: x.view(s) for n, x, s in zip(self.names, parts, self._all_shapes, strict=True)}
        out = self._masked([table[n] for n in self.slots])
        return out + [m for b in self.quotient.gather_stacks(table) for m in b]

    def from_tangent(self, xi: Tangent) -> Tensor:
        """Inverse (and adjoint) of :meth:`to_tangent`."""
        table = dict(zip(self.slots, self._masked(xi[: len(self.slots)]), strict=False))
        if self.blocks:
            moved = self.quotient.split_touched(self.quotient.scatter_flat(self._pairs(xi)))
            for n, x in moved.items():
                table[n] = table[n] + x if n in table else x
        like = next(iter(self.params.values()))
        return torch.cat(
            [
                table[n].reshape(-1) if n in table else like.new_zeros(k)
                for n, k in zip(self.names, self._all_sizes, strict=True)
            ]
        )

    def lower(self, xi: Tangent) -> Tangent:
        """``M xi``: the metric applied to a tangent vector (its Riesz covector)."""
        out = self._split(self._flat(xi) * self._inv) if self.slots else []
        for blk, m, (xG, xH) in zip(self.blocks, self.metrics, self._pairs(xi), strict=True):
            P, Q = Gram.of(blk.G, EPS), Gram.of(blk.H, EPS)
            if m == "invariant":
                out.extend([P.solve(xG, left=False), Q.solve(xH, left=False)])
            else:
                out.extend([xG @ Q.matrix, xH @ P.matrix])
        return out

    def inner(self, a, b):
        """Metric inner product (0-dim)."""
        total = super().inner(a, b)
        for blk, m, x, y in zip(
            self.blocks, self.metrics, self._pairs(a), self._pairs(b), strict=True
        ):
            total = total + inner(blk, x, y, m, EPS).sum()
        return total

    def gradient(self, g):
        """Horizontal Riemannian gradient from the Euclidean one.

        One projection, on the horizontal space of the whole group (which contains each
        block's vertical space, so no per-block projection first); the metric applied
        to ``M^-1 g`` is ``g`` itself, masked, which the projection takes as given.
        """
        # the masked covector M (M^-1 g) = g, built in g's own buffer where g is scratch
        covector = g.flat if getattr(g, "scratch", False) else tangent.flat_copy(g)
        out = self.spare()  # M^-1 g, written in place
        k = self._slot_total
        if self.slots:
            torch.mul(covector[:k], self._scale, out=out.flat[:k])
            if self._masks_slots:
                covector[:k].mul_(self._keep)
        for blk, m, x, r in zip(
            self.blocks, self.metrics, self._pairs(g), self._pairs(out), strict=True
        ):
            _block_gradient(blk, x, m, r)
        return self.horizontal.project_flat(out.flat, covector)

    def gradient_norm(self, g, d):
        """Metric norm of ``d = gradient(g)``: ``<g, d>`` (d is M^-1 g projected M-orthogonally)."""
        return tangent.dot(g, d).clamp_min(0).sqrt()

    def point(self, xi):
        """Geodesic step on GL blocks, straight step elsewhere."""
        pairs = zip(self.blocks, self._pairs(xi), strict=True)
        return self._point(xi, [self.move(b, x, s) for s, (b, x) in enumerate(pairs)])

    def _point(self, xi, moves: list[Pair] | Tensor) -> dict[str, Tensor]:
        """The moved point: ``moves`` per stack, or laid out by ``Quotient.stack_buffer``."""
        out = dict(self.params)
        if isinstance(moves, Tensor):
            flat = self.quotient.scatter_values(moves).add_(self._touched_flat)
            out.update(self.quotient.split_touched(flat))
        elif moves:
            flat = self.quotient.scatter_flat(moves).add_(self._touched_flat)
            out.update(self.quotient.split_touched(flat))
        for n, x, k in zip(self.slots, xi, self._partial, strict=False):
            out[n] = out[n] + x if k is None else torch.addcmul(out[n], x, k)
        return out

    def linearize(self, xi):
        """``point(xi)`` and its pullback: masked on plain entries, a VJP per block.

        The block VJP is :func:`wsym.sharpness.geometry.geodesic_step_linearized` (closed form,
        sharing its products with the step) for the second-order step, autograd
        through :meth:`move` where a subclass replaces it.
        """
        pairs = [Pair(x.G.detach(), x.H.detach()) for x in self._pairs(xi)]
        if type(self).move is Geodesic.move:
            # each stack's step written into one flat buffer, scattered from there
            moves, outs = self.quotient.stack_buffer(self._touched_flat) if pairs else ([], [])
            vjps = []
            for b, x, m, o in zip(self.blocks, pairs, self.metrics, outs, strict=True):
                move, vjp = geodesic_step_linearized(b, x, m, EPS, out=o)
                for dst, src in zip(o, move, strict=True):
                    if src is not dst:
                        dst.copy_(src)
                vjps.append(vjp)
        else:
            moves = [
                self.move(b, x, s) for s, (b, x) in enumerate(zip(self.blocks, pairs, strict=True))
            ]
            vjps = [
                self._autograd_vjp(b, x, s)
                for s, (b, x) in enumerate(zip(self.blocks, pairs, strict=True))
            ]
        with torch.no_grad():
            return self._point(xi, moves), lambda grads: self._pullback(vjps, grads)

    def _autograd_vjp(self, block: Pair, xi: Pair, s: int) -> Callable:
        xi = Pair(xi.G.clone().requires_grad_(True), xi.H.clone().requires_grad_(True))

        def vjp(g: Pair, out: Pair | None = None) -> Pair:
            with torch.enable_grad():
                return Pair(*torch.autograd.grad(self.move(block, xi, s), xi, grad_outputs=g))

        return vjp

    def _pullback(self, vjps: list[Callable], grads: list[Tensor]) -> Tangent:
        table = dict(zip(self.names, grads, strict=True))
        out = self.spare()
        for dst, n, k in zip(out, self.slots, self._partial, strict=False):
            if k is None:
                dst.copy_(table[n])
            else:
                torch.mul(table[n], k, out=dst)
        pulled = self.quotient.gather_stacks(table)
        for vjp, g, dst in zip(vjps, pulled, self._pairs(out), strict=True):
            for d, x in zip(dst, vjp(g, dst), strict=True):
                if x is not d:
                    d.copy_(x)
        # scratch: gradient() may overwrite it with its masked covector, which differs only
        # on entries where the Riemannian gradient is zero (so <g, gradient(g)> is unchanged)
        out.scratch = True
        return out

    def move(self, block: Pair, xi: Pair, s: int = 0) -> Pair:
        """Displacement ``gamma_xi(1) - block`` of stack ``s``: ``xi - Gamma(xi, xi) / 2``."""
        return geodesic_step_linearized(block, xi, self.metrics[s], EPS)[0]

    def random(self, gen):
        """A random horizontal direction in the metric's coordinates (equivariant draw)."""
        out = super().random(gen)
        for (G, H), m, rows in zip(self.blocks, self.metrics, self.quotient.rows, strict=True):
            # invariant: xi = Z G with Z Gaussian (n x n), whose rows are N(0, G^T G): drawn
            # as Gaussian rows times the Cholesky factor (n x h, not n x n). Mixed:
            # xi_G = Z H Q^-1 with rows N(0, H^T H) before the solve, transforming like G
            PG, PH = Gram.of(G, EPS), Gram.of(H, EPS)
            cov = (PG, PH) if m == "invariant" else (PH, PG)
            # both factors draw as many rows (the longer one's), the first rows kept: the
            # stream does not depend on how the stack pads each factor
            r = max(G.shape[-2], H.shape[-2])
            zG, zH = (_randn(M, gen, (*M.shape[:-2], r, M.shape[-1])) for M in (G, H))
            xG = zG[..., : G.shape[-2], :] @ torch.linalg.cholesky(cov[0].matrix).mT
            xH = zH[..., : H.shape[-2], :] @ torch.linalg.cholesky(cov[1].matrix).mT
            if m != "invariant":
                xG, xH = PH.solve(xG, left=False), PG.solve(xH, left=False)
            if rows is not None:  # the draws mix rows: keep the padding rows zero
                xG, xH = xG * rows.G, xH * rows.H
            out.extend([xG, xH])
        return self.horizontal.project(out)


def _block_gradient(block: Pair, grad: Pair, metric: str, out: Pair) -> None:
    """Unprojected :func:`~wsym.sharpness.geometry.riemannian_gradient` of a stack, in ``out``."""
    (G, H), (gG, gH) = block, grad
    P, Q = Gram.of(G, EPS), Gram.of(H, EPS)
    if metric == "invariant":
        factors = (P.matrix, Q.matrix)
    elif P.inverse is not None and Q.inverse is not None:
        factors = (Q.inverse, P.inverse)
    else:  # not numerically positive definite: the LU solve of riemannian_gradient
        fallback = riemannian_gradient(block, grad, metric, EPS, project=False)
        for dst, src in zip(out, fallback, strict=True):
            dst.copy_(src)
        return
    for g, M, dst in zip((gG, gH), factors, out, strict=True):
        if g.shape[-1] == 1:
            torch.mul(g, M, out=dst)
        else:
            torch.matmul(g, M, out=dst)
