r"""Sharpness of a trained network, measured so that its symmetries cannot hide it.

:func:`sharpness` is the entry point. The worst-case measures solve, per batch,

.. math::
    S = \sum_k w_k \max_{\|\xi\|_\theta \le \rho} \ell_k(\gamma_\xi(1)) - \ell_k(\theta),
    \qquad w_k = n_k / \textstyle\sum_j n_j,

with an Auto-PGD-like ascent on the tangent vector :math:`\xi` (Croce & Hein 2020, as in
Andriushchenko et al. 2023): normalized Riemannian-gradient steps, step size :math:`2\rho`
at first and halved (restarting from the best point) at checkpoints where fewer than
75% of the steps improved, momentum 0.75, projection onto the metric ball. The ascent
starts at :math:`\xi = 0` and its first direction is the Riemannian gradient, so every
step is equivariant: a symmetric copy of the network follows the image of the same
path. With ``average=True`` the max is replaced by the mean over ``steps`` random
directions of norm :math:`\rho`, drawn from ``seed`` in the metric's own coordinates.

====================  =============================  ==========================================
measure               perturbation                   invariant to (group kinds)
====================  =============================  ==========================================
``euclidean``         ``theta + xi``, ``|xi|_2``      none
``adaptive``          ``theta + |w| * u``, ``|u|_2``  scaling, sign, norm_scaling, permutation
``geodesic-inv``      geodesic step (GL blocks,       as adaptive, plus gl (see below)
``geodesic-mix``      invariant / mixed metric)
``hessian-trace``     --                             permutation, orthogonal
``lambda-max``        --                             permutation, orthogonal
``fisher``            --                             scaling, sign, norm_scaling (same seed;
                                                     weight-relative damping); permutation in
                                                     distribution
====================  =============================  ==========================================

Geodesic measures (:mod:`wsym.quotient`): on each ``gl`` group's blocks ``(G, H)``, and
on each ``scaling`` group with exponents +-1 taken as ``GL(1)`` blocks per unit (``G`` the
unit's exponent +1 entries, ``H`` its exponent -1 entries; only where no other
continuous group touches them, e.g. not for two ReLU layers sharing a weight), the
tangent is horizontal, measured with the invariant (``-inv``) or mixed (``-mix``) metric
and moved along by :func:`wsym.geometry.geodesic_step`; every other entry uses the
elementwise adaptive metric and a straight step. Caveat: a scaling group that rescales
*rows* of a GL block (a LayerNorm gain in front of ``W_Q``) is not an isometry of the
block metrics, so invariance to scaling holds for scaling groups outside GL blocks.
Without GL or GL(1) blocks the geodesic measures equal ``adaptive`` (with a warning).
Average-case values (same seed) are exactly invariant to ``gl`` and to scaling groups
outside GL blocks, ``adaptive`` also to sign groups; to permutations, and to sign
groups acting on GL rows, only in distribution (the Gaussian draw is not permuted or
flipped with the units). Worst-case values are invariant to all the listed kinds.

Evaluation: the model is copied to float64 and called with
:func:`torch.func.functional_call` in eval mode (BatchNorm uses running statistics,
dropout is off). Curvature measures delegate to :mod:`wsym.curvature` (``options`` are
passed on, e.g. ``probes=`` or ``iters=``); they take positional (not dict) inputs.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from wsym.curvature.objective import as_double, batch_size, call
from wsym.errors import SymmetryWarning, WsymInputError
from wsym.geometry import (
    Gram,
    Pair,
    christoffel,
    geodesic_step_linearized,
    horizontal,
    inner,
    riemannian_gradient,
)
from wsym.geometry.metrics import _elementwise_shift
from wsym.graph.trace import eval_mode
from wsym.quotient import Quotient
from wsym.spec import SymmetrySpec

MEASURES = (
    "euclidean",
    "adaptive",
    "geodesic-inv",
    "geodesic-mix",
    "hessian-trace",
    "lambda-max",
    "fisher",
)
EPS = 1e-14
"""GL Gram regularization (relative to the mean eigenvalue): finite on singular blocks."""
ELEMENTWISE_EPS = 1e-20
"""Adaptive-metric shift (relative to mean w^2): tiny, so rescalings by 1e4 stay exact."""

Tangent = list[Tensor]


class Perturbation:
    """Tangent vectors at ``params``: their metric, gradients, random draws and the moved point.

    Subclasses implement :meth:`inner` and :meth:`gradient` (and override
    :meth:`point` / :meth:`random` where the step is not straight). A tangent is a
    list of tensors shaped like :attr:`shapes`.
    """

    def __init__(self, params: dict[str, Tensor]):
        self.params = params
        self.names = list(params)

    def zero(self) -> Tangent:
        """The zero tangent vector."""
        return [torch.zeros_like(t) for t in self.coordinates()]

    def coordinates(self) -> list[Tensor]:
        """The base point in tangent layout (one tensor per slot)."""
        return [self.params[n] for n in self.names]

    def inner(self, a: Tangent, b: Tangent) -> Tensor:
        """Metric inner product (0-dim)."""
        raise NotImplementedError

    def gradient(self, g: Tangent) -> Tangent:
        """Riemannian gradient from the Euclidean gradient with respect to the tangent."""
        raise NotImplementedError

    def norm(self, xi: Tangent) -> Tensor:
        """Metric norm (0-dim)."""
        return self.inner(xi, xi).clamp_min(0).sqrt()

    def point(self, xi: Tangent) -> dict[str, Tensor]:
        """Perturbed parameters (straight step ``theta + xi``)."""
        return {n: self.params[n] + x for n, x in zip(self.names, xi, strict=False)}

    def linearize(self, xi: Tangent) -> tuple[dict[str, Tensor], Callable]:
        """``point(xi)`` (no graph) and the pullback of gradients there to gradients in ``xi``.

        The pullback maps the gradient of a function at ``point(xi)`` (one tensor per
        parameter, :attr:`names` order) through the transposed Jacobian of
        :meth:`point` (the identity for a straight step), so the ascent
        differentiates the network with respect to its parameters only.
        """
        with torch.no_grad():
            return self.point(xi), list

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

    The metric weights ``w^2 + s`` (:func:`wsym.geometry.adaptive_inner`) are computed
    once at the base point and the tangent is handled as one flat vector where that
    saves per-tensor work.
    """

    def __init__(self, params, mask: dict[str, Tensor] | None = None):
        super().__init__(params)
        self.keep = {n: ~mask[n] if mask else None for n in self.names}
        dens, keeps = [], []
        for n in self.names:
            w = self.params[n]
            dens.append((w * w + _elementwise_shift(w, ELEMENTWISE_EPS)).reshape(-1))
            k = self.keep[n]
            keeps.append(torch.ones_like(dens[-1]) if k is None else k.reshape(-1).to(w.dtype))
        keep = torch.cat(keeps) if keeps else torch.zeros(0)
        den = torch.cat(dens) if dens else torch.zeros(0)
        self._inv = keep / den  # metric weight, 0 on covered entries
        self._scale = keep * den  # Riemannian-gradient factor
        # per parameter: None where no entry is covered (nothing to mask), else the mask
        self._partial = [
            None if k is None or bool(k.all()) else k.to(self.params[n].dtype)
            for n, k in self.keep.items()
        ]
        self._shapes = [self.params[n].shape for n in self.names]
        self._sizes = [self.params[n].numel() for n in self.names]

    def _flat(self, xs) -> Tensor:
        return torch.cat([x.reshape(-1) for x in xs[: len(self.names)]])

    def _split(self, flat: Tensor) -> list[Tensor]:
        parts = flat.split(self._sizes)
        return [x.reshape(s) for x, s in zip(parts, self._shapes, strict=True)]

    def _masked(self, xs):
        return [x if k is None else x * k for x, k in zip(xs, self._partial, strict=False)]

    def _weights(self) -> list[Tensor]:
        return [self.params[n] for n in self.names]

    def inner(self, a, b):
        """Metric inner product (0-dim)."""
        if not self.names:
            return torch.zeros((), dtype=torch.float64)
        fa = self._flat(a)
        return torch.dot(fa * self._inv, fa if b is a else self._flat(b))

    def gradient(self, g):
        """Riemannian gradient from the Euclidean one."""
        return self._split(self._flat(g) * self._scale)

    def random(self, gen):
        """A random direction in the metric's coordinates (equivariant draw)."""
        # w * z (not |w| * z): a sign flip of w flips the draw, as it flips the tangent
        return self._masked([w * _randn(w, gen) for w in self._weights()])


class Geodesic(Adaptive):
    """GL / GL(1) blocks with the invariant/mixed metric and geodesic steps; adaptive elsewhere."""

    def __init__(self, params, spec: SymmetrySpec, metric: str):
        quotient = Quotient(spec, params)
        super().__init__(params, quotient.covered)
        self.quotient, self.metric = quotient, metric
        self.blocks = quotient.stacks  # equal-shape blocks stacked: one solve per stack

    def coordinates(self):
        """Parameters, then the GL blocks' G and H."""
        return [self.params[n] for n in self.names] + [m for b in self.blocks for m in b]

    def _pairs(self, xi) -> list[Pair]:
        rest = xi[len(self.names) :]
        return [Pair(rest[2 * j], rest[2 * j + 1]) for j in range(len(self.blocks))]

    def inner(self, a, b):
        """Metric inner product (0-dim)."""
        total = super().inner(a, b)
        for blk, x, y in zip(self.blocks, self._pairs(a), self._pairs(b), strict=True):
            total = total + inner(blk, x, y, self.metric, EPS).sum()
        return total

    def gradient(self, g):
        """Riemannian gradient from the Euclidean one."""
        out = super().gradient(g)
        for blk, x in zip(self.blocks, self._pairs(g), strict=True):
            out.extend(riemannian_gradient(blk, x, self.metric, EPS))
        return out

    def point(self, xi):
        """Geodesic step on GL blocks, straight step elsewhere."""
        pairs = zip(self.blocks, self._pairs(xi), strict=True)
        return self._point(xi, [self.move(b, x) for b, x in pairs])

    def _point(self, xi, moves: list[Pair]) -> dict[str, Tensor]:
        out = {
            n: self.params[n] + x if k is None else torch.addcmul(self.params[n], x, k)
            for n, x, k in zip(self.names, xi, self._partial, strict=False)
        }
        self.quotient.add_stacks(out, moves)
        return out

    def linearize(self, xi):
        """``point(xi)`` and its pullback: masked on plain entries, a VJP per block.

        The block VJP is :func:`wsym.geometry.geodesic_step_linearized` (closed form,
        sharing its products with the step) for the second-order step, autograd
        through :meth:`move` where a subclass replaces it.
        """
        pairs = [Pair(x.G.detach(), x.H.detach()) for x in self._pairs(xi)]
        if type(self).move is Geodesic.move:
            steps = [
                geodesic_step_linearized(b, x, self.metric, EPS)
                for b, x in zip(self.blocks, pairs, strict=True)
            ]
            moves, vjps = [m for m, _ in steps], [v for _, v in steps]
        else:
            moves = [self.move(b, x) for b, x in zip(self.blocks, pairs, strict=True)]
            vjps = [self._autograd_vjp(b, x) for b, x in zip(self.blocks, pairs, strict=True)]
        with torch.no_grad():
            return self._point(xi, moves), lambda grads: self._pullback(vjps, grads)

    def _autograd_vjp(self, block: Pair, xi: Pair) -> Callable:
        xi = Pair(xi.G.clone().requires_grad_(True), xi.H.clone().requires_grad_(True))

        def vjp(g: Pair) -> Pair:
            with torch.enable_grad():
                return Pair(*torch.autograd.grad(self.move(block, xi), xi, grad_outputs=g))

        return vjp

    def _pullback(self, vjps: list[Callable], grads: list[Tensor]) -> Tangent:
        out = self._masked(grads)
        pulled = self.quotient.gather_stacks(dict(zip(self.names, grads, strict=True)))
        for vjp, g in zip(vjps, pulled, strict=True):
            out.extend(vjp(g))
        return out

    def move(self, block: Pair, xi: Pair) -> Pair:
        """Displacement ``gamma_xi(1) - block`` of one block: ``xi - Gamma(xi, xi) / 2``."""
        gamma = christoffel(block, xi, self.metric, EPS)
        return Pair(xi.G - 0.5 * gamma.G, xi.H - 0.5 * gamma.H)

    def random(self, gen):
        """A random direction in the metric's coordinates (equivariant draw)."""
        out = super().random(gen)
        for (G, H), rows in zip(self.blocks, self.quotient.rows, strict=True):
            lead, n, m = G.shape[:-2], G.shape[-2], H.shape[-2]
            if self.metric == "invariant":  # xi = M G: Gaussian in metric coordinates
                xG = _randn(G, gen, (*lead, n, n)) @ G
                xH = _randn(H, gen, (*lead, m, m)) @ H
            else:  # xi_G = M H Q^-1 transforms like G under GL
                xG = Gram.of(H, EPS).solve(_randn(G, gen, (*lead, n, m)) @ H, left=False)
                xH = Gram.of(G, EPS).solve(_randn(H, gen, (*lead, m, n)) @ G, left=False)
            if rows is not None:  # the draws mix rows: keep the padding rows zero
                xG, xH = xG * rows.G, xH * rows.H
            out.extend(horizontal((G, H), (xG, xH), self.metric, EPS))
        return out


def _scale(xi: Tangent, c) -> Tangent:
    return list(torch._foreach_mul(xi, c))


def _add(a: Tangent, b: Tangent, c=1.0) -> Tangent:
    return list(torch._foreach_add(a, b, alpha=c))


def _project(geom: Perturbation, xi: Tangent, rho: float) -> Tangent:
    n = float(geom.norm(xi))
    return _scale(xi, rho / n) if n > rho else xi


def _direction(geom, f, xi) -> tuple[float, Tangent]:
    """Loss at ``xi`` and the unit-norm Riemannian ascent direction there."""
    moved, pullback = geom.linearize(xi)
    leaves = [moved[n].detach().requires_grad_(True) for n in geom.names]
    value = f(dict(zip(geom.names, leaves, strict=True)))
    grads = torch.autograd.grad(value, leaves, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads, strict=True)]
    d = geom.gradient(pullback(grads))
    n = float(geom.norm(d))
    d = _scale(d, 1.0 / n) if n > 0 and math.isfinite(n) else [torch.zeros_like(x) for x in d]
    return float(value.detach()), [x.detach() for x in d]


def worst_case(geom: Perturbation, f: Callable, rho: float, steps: int) -> float:
    """Auto-PGD-like ascent of ``f(point(xi)) - f(theta)`` over ``||xi|| <= rho``."""
    alpha, interval = 0.75, max(2, steps // 4)
    zero = geom.zero()
    base, d = _direction(geom, f, zero)
    eta, best, best_val, successes = 2 * rho, zero, base, 0
    prev, x = zero, zero
    new = _project(geom, _add(x, d, eta), rho)
    for k in range(steps):
        val, d = _direction(geom, f, new)
        if val > best_val:
            best, best_val, successes = new, val, successes + 1
        prev, x = x, new
        z = _project(geom, _add(x, d, eta), rho)
        new = _project(
            geom, _add(_add(x, _add(z, x, -1.0), alpha), _add(x, prev, -1.0), 1 - alpha), rho
        )
        if (k + 1) % interval == 0:
            if successes < 0.75 * interval:
                eta, new, x = eta / 2, best, best
            successes = 0
    return best_val - base


def average_case(
    geom: Perturbation, fs: list[Callable], weights, rho: float, steps: int, seed: int
):
    """Mean over ``steps`` random directions of norm ``rho`` (same directions for every batch)."""
    gen = torch.Generator().manual_seed(seed)
    dirs = []
    for _ in range(steps):
        xi = geom.random(gen)
        dirs.append(_scale(xi, rho / max(float(geom.norm(xi)), 1e-300)))
    total = 0.0
    with torch.no_grad():
        for f, w in zip(fs, weights, strict=True):
            base = float(f(geom.params))
            total += w * sum(float(f(geom.point(xi))) - base for xi in dirs) / steps
    return total


def _check(batches, measure, rho, steps) -> None:
    if measure not in MEASURES:
        raise WsymInputError(
            f"unknown sharpness measure {measure!r}; use one of {', '.join(MEASURES)}"
        )
    if not isinstance(rho, int | float) or not math.isfinite(rho) or rho <= 0:
        raise WsymInputError(f"rho must be a positive number, got {rho!r}; pass e.g. rho=0.05")
    if not isinstance(steps, int) or steps < 1:
        raise WsymInputError(f"steps must be a positive integer, got {steps!r}")
    if not batches:
        raise WsymInputError("batches is empty; pass a list of (inputs, targets)")


def _curvature(measure, model64, batches64, loss_fn, seed, options) -> float:
    from wsym import curvature

    fn = {
        "hessian-trace": curvature.hessian_trace,
        "lambda-max": curvature.lambda_max,
        "fisher": curvature.fisher_riemannian_sharpness,
    }[measure]
    if measure == "fisher":
        options = {"relative": True, **options}
    return float(fn(model64, batches64, loss_fn, seed=seed, **options))


def sharpness(
    model: nn.Module,
    batches: Sequence[tuple[Any, Any]],
    loss_fn: Callable[[Any, Any], Tensor],
    spec: SymmetrySpec | None = None,
    measure: str = "geodesic-mix",
    rho: float = 0.05,
    average: bool = False,
    seed: int = 0,
    steps: int = 10,
    **options,
) -> float:
    r"""Sharpness of ``model`` on ``batches`` (see the module docstring for the measures).

    Args:
        model: the network; not modified (a float64 copy is evaluated in eval mode).
        batches: list of ``(inputs, targets)``; inputs a tensor, tuple, or dict of kwargs.
        loss_fn: ``loss_fn(outputs, targets)`` -> scalar, a mean over the batch.
        spec: the model's symmetries; ``None`` detects them on the first inputs.
        measure: one of :data:`MEASURES`.
        rho: radius of the perturbation ball (> 0), in the measure's metric.
        average: mean over random directions instead of the worst case.
        seed: seeds the random directions (and curvature probes); same seed, same value.
        steps: ascent steps (worst case) or random directions (average case).
        **options: passed to the :mod:`wsym.curvature` function of curvature measures.

    Returns:
        The sharpness as a Python float.

    Example:
        >>> import torch, wsym
        >>> from wsym.reference import MLP
        >>> _ = torch.manual_seed(0)
        >>> model, x = MLP(4, [3], 2), torch.randn(8, 4)
        >>> loss = lambda out, y: ((out - y) ** 2).mean()
        >>> s = sharpness(model, [(x, torch.zeros(8, 2))], loss, measure="adaptive", rho=0.1)
        >>> s >= 0
        True
    """
    batches = list(batches)
    _check(batches, measure, rho, steps)
    model64 = copy.deepcopy(model).double()
    batches64 = [(as_double(x), as_double(y)) for x, y in batches]
    if measure in ("hessian-trace", "lambda-max", "fisher"):
        return _curvature(measure, model64, batches64, loss_fn, seed, options)
    if options:
        raise WsymInputError(f"unknown options for {measure!r}: {', '.join(options)}")
    params = {n: p.detach() for n, p in model64.named_parameters() if p.requires_grad}
    geom = _geometry(model, batches, spec, measure, params)
    fs = [_batch_loss(model64, loss_fn, x, y) for x, y in batches64]
    sizes = [batch_size(x) for x, _ in batches64]
    weights = [n / sum(sizes) for n in sizes]
    with eval_mode(model64):
        if average:
            return float(average_case(geom, fs, weights, rho, steps, seed))
        return float(
            sum(w * worst_case(geom, f, rho, steps) for f, w in zip(fs, weights, strict=True))
        )


def _batch_loss(model64, loss_fn, inputs, targets) -> Callable:
    return lambda params: loss_fn(call(model64, params, inputs), targets)


def _geometry(model, batches, spec, measure, params) -> Perturbation:
    if measure == "euclidean":
        return Euclidean(params)
    if measure == "adaptive":
        return Adaptive(params)
    if spec is None:
        from wsym.detect import detect

        spec = detect(model, batches[0][0])
    metric = "invariant" if measure == "geodesic-inv" else "mixed"
    geom = Geodesic(params, spec, metric)
    if not geom.blocks:
        warnings.warn(
            f"{measure}: the spec has no GL group (nor GL(1) scaling block); "
            "the measure equals 'adaptive'",
            SymmetryWarning,
            stacklevel=3,
        )
    return geom
