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
path. With ``average=True`` the max is replaced by the mean over ``steps`` antithetic
pairs ``+-xi`` of random directions of norm :math:`\rho` (the first-order term cancels
in each pair), drawn from ``seed``; ``with_error=True`` also returns the standard error.

====================  =============================  ==========================================
measure               perturbation                   invariant to (group kinds)
====================  =============================  ==========================================
``euclidean``         ``theta + xi``, ``|xi|_2``      none
``adaptive``          ``theta + |w| * u``, ``|u|_2``  scaling, sign, norm_scaling, permutation
``geodesic-inv``      horizontal geodesic step        every detected kind, the whole group at
``geodesic-mix``      (invariant / mixed metric)     once (see below)
``hessian-trace``     --                             permutation, orthogonal
``lambda-max``        --                             permutation, orthogonal
``fisher``            --                             scaling, sign, norm_scaling, permutation
                                                     (evaluated at the canonical point, same seed)
====================  =============================  ==========================================

Geodesic measures (``docs/geometry.md``): the quotient by the *whole* continuous group.
GL, orthogonal and GL(1) blocks (:mod:`wsym.sharpness.quotient`) use the invariant (``-inv``) or
mixed (``-mix``) metric and the second-order geodesic step, every other entry the
elementwise adaptive metric and a straight step; the tangent is projected on the
horizontal space of every continuous group, overlapping or not
(:mod:`wsym.sharpness.vertical`), and everything is evaluated at the balanced point of
the diagonal groups (:mod:`wsym.sharpness.gauge`), where the metric is invariant to the
product of all of them. Average-case directions are drawn at the canonical point
(:func:`wsym.canonicalize`), in canonical coordinates, so the same seed gives the same
value for every point of the orbit. A spec without continuous groups gives
``adaptive`` (with a warning).

Evaluation: the model is copied to the working ``dtype`` (float64 by default, float32
for large models) and called with
:func:`torch.func.functional_call` in eval mode (BatchNorm uses running statistics,
dropout is off). Curvature measures delegate to :mod:`wsym.sharpness.curvature` (``options`` are
passed on, e.g. ``probes=`` or ``iters=``); they take positional (not dict) inputs.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from wsym.errors import SymmetryWarning, WsymInputError
from wsym.group.fits import check_fits
from wsym.group.spec import SymmetrySpec
from wsym.models.arguments import check_batches, check_loss, check_module, check_runs
from wsym.models.calling import eval_mode, model_inputs
from wsym.sharpness import tangent
from wsym.sharpness.curvature.objective import as_dtype, batch_size, call
from wsym.sharpness.gauge import balanced
from wsym.sharpness.micro_batch import BatchLoss, split
from wsym.sharpness.micro_batch import check as check_micro_batch
from wsym.sharpness.perturbation import Adaptive, Euclidean, Geodesic, Perturbation, Tangent

MEASURES = (
    "euclidean",
    "adaptive",
    "geodesic-inv",
    "geodesic-mix",
    "hessian-trace",
    "lambda-max",
    "fisher",
)


def _scale(xi: Tangent, c, fresh: bool = False) -> Tangent:
    """``c * xi``; ``fresh``: nothing else holds ``xi``, which may be overwritten."""
    return tangent.scale(xi, c, out=xi if fresh else None)


def _add(a: Tangent, b: Tangent, c=1.0, into: Tangent | None = None) -> Tangent:
    """``a + c * b``, written into ``into`` if given (a tangent nothing else holds)."""
    return tangent.add(a, b, c, out=into)


def _project(geom: Perturbation, xi: Tangent, rho: float) -> Tangent:
    """``xi`` scaled onto the ball; ``xi`` must be fresh (it may be scaled in place)."""
    n = float(geom.norm(xi))
    return _scale(xi, rho / n, fresh=True) if n > rho else xi


def _direction(geom, f, xi) -> tuple[float, Tangent]:
    """Loss at ``xi`` and the unit-norm Riemannian ascent direction there."""
    moved, pullback = geom.linearize(xi)
    leaves = {n: moved[n].detach().requires_grad_(True) for n in geom.names}
    value, grads = BatchLoss.of(f).value_and_grad(leaves)
    g = pullback(grads)
    d = geom.gradient(g)
    n = float(geom.gradient_norm(g, d))
    geom.release(g)
    d = _scale(d, 1.0 / n, fresh=True) if n > 0 and math.isfinite(n) else geom.zero()
    if isinstance(d, tangent.FlatTangent):
        return value, d.like(d.flat.detach())
    return value, [x.detach() for x in d]


def worst_case(geom: Perturbation, f: Callable, rho: float, steps: int) -> float:
    """Auto-PGD-like ascent of ``f(point(xi)) - f(theta)`` over ``||xi|| <= rho``.

    ``f``: ``params -> loss``, or a :class:`wsym.sharpness.micro_batch.BatchLoss`
    (gradients accumulated over its micro-batches).
    """
    alpha, interval = 0.75, max(2, steps // 4)
    zero = geom.zero()
    base, d = _direction(geom, f, zero)
    eta, best, best_val, successes = 2 * rho, zero, base, 0
    prev, x = zero, zero
    new = _project(geom, _add(x, d, eta, into=geom.spare()), rho)
    geom.release(d)

    def drop(xi, *kept):  # recycle xi's storage unless a kept tangent is xi
        if all(xi is not k for k in kept):
            geom.release(xi)

    for k in range(steps):
        val, d = _direction(geom, f, new)
        if val > best_val:
            best, best_val, successes = new, val, successes + 1
        old, (prev, x) = prev, (x, new)
        drop(old, prev, x, best)
        z = _project(geom, _add(x, d, eta, into=geom.spare()), rho)
        geom.release(d)
        # x + alpha (z - x) + (1 - alpha) (x - prev), in buffers the step owns
        toward = _add(z, x, -1.0, into=z)
        toward = _add(x, toward, alpha, into=toward)
        back = _add(x, prev, -1.0, into=geom.spare())
        new = _project(geom, _add(toward, back, 1 - alpha, into=back), rho)
        geom.release(toward)
        if (k + 1) % interval == 0:
            if successes < 0.75 * interval:
                drop(new, best)
                drop(x, prev, best)
                eta, new, x = eta / 2, best, best
            successes = 0
    return best_val - base


def average_case(
    geom: Perturbation, fs: list[Callable], weights, rho: float, steps: int, seed: int
) -> tuple[float, float]:
    """Mean over ``steps`` antithetic pairs of random directions of norm ``rho``, and its error.

    Each draw ``xi`` is evaluated at ``+xi`` and ``-xi`` (same directions for every
    batch): the first-order term of the loss cancels in each pair, so the estimate is
    the second-order change it is meant to be, not round-off of the gradient term.

    Returns:
        ``(mean, standard error of the mean over the pairs)``.
    """
    gen = torch.Generator().manual_seed(seed)
    dirs = []
    for _ in range(steps):
        xi = geom.random(gen)
        dirs.append(_scale(xi, rho / max(float(geom.norm(xi)), 1e-300)))
    pairs = torch.zeros(steps, dtype=torch.float64)
    with torch.no_grad():
        for f, w in zip(fs, weights, strict=True):
            base = float(f(geom.params))
            for k, xi in enumerate(dirs):
                up, down = float(f(geom.point(xi))), float(f(geom.point(_scale(xi, -1.0))))
                pairs[k] += w * (0.5 * (up + down) - base)
    err = float(pairs.std() / math.sqrt(steps)) if steps > 1 else float("nan")
    return float(pairs.mean()), err


def _check(measure, rho, steps) -> None:
    if measure not in MEASURES:
        raise WsymInputError(
            f"unknown sharpness measure {measure!r}; use one of {', '.join(MEASURES)}"
        )
    if not isinstance(rho, int | float) or not math.isfinite(rho) or rho <= 0:
        raise WsymInputError(f"rho must be a positive number, got {rho!r}; pass e.g. rho=0.05")
    if not isinstance(steps, int) or steps < 1:
        raise WsymInputError(f"steps must be a positive integer, got {steps!r}")


def _curvature(measure, model64, batches64, loss_fn, seed, options) -> float:
    from wsym.sharpness import curvature

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
    with_error: bool = False,
    dtype: torch.dtype = torch.float64,
    micro_batch: int | None = None,
    **options,
) -> float | Estimate:
    r"""Sharpness of ``model`` on ``batches`` (see the module docstring for the measures).

    Args:
        model: the network; not modified (a copy at ``dtype`` is evaluated in eval mode).
        batches: list of ``(inputs, targets)``; inputs a tensor, tuple, or dict of kwargs.
        loss_fn: ``loss_fn(outputs, targets)`` -> scalar, a mean over the batch.
        spec: the model's symmetries; ``None`` detects them on the first inputs.
        measure: one of :data:`MEASURES`.
        rho: radius of the perturbation ball (> 0), in the measure's metric.
        average: mean over random directions instead of the worst case.
        seed: seeds the random directions (and curvature probes); same seed, same value.
        steps: ascent steps (worst case) or antithetic pairs of random directions
            (average case).
        with_error: return an :class:`Estimate` (value and standard error; the
            average case's error is over its antithetic pairs) instead of a float.
        dtype: the working precision, ``torch.float64`` (references, invariance checks)
            or ``torch.float32`` (large models: half the memory, about twice the speed).
            The model, its inputs and every tangent vector of the ascent are held at it.
        micro_batch: evaluate each batch in micro-batches of at most this many samples,
            accumulating the loss and its gradients (the same value up to round-off), so
            that activation memory is one micro-batch's; None: whole batches.
        **options: passed to the :mod:`wsym.sharpness.curvature` function of curvature measures.

    Returns:
        The sharpness as a Python float.

    Memory: one copy of the model at ``dtype``; the geodesic measures add their
    setup's index tables and a few tangent-sized buffers (model-sized, at ``dtype``),
    the ascent one micro-batch's activations and one accumulated gradient.

    Example:
        >>> import torch, wsym
        >>> from wsym.models.networks import MLP
        >>> _ = torch.manual_seed(0)
        >>> model, x = MLP(4, [3], 2), torch.randn(8, 4)
        >>> loss = lambda out, y: ((out - y) ** 2).mean()
        >>> s = sharpness(model, [(x, torch.zeros(8, 2))], loss, measure="adaptive", rho=0.1)
        >>> s >= 0
        True
    """
    check_module(model, "wsym.sharpness")
    batches = check_batches(batches, "wsym.sharpness")
    check_loss(loss_fn, "wsym.sharpness")
    if spec is not None:
        check_fits(spec, model.state_dict(), "wsym.sharpness")
    _check(measure, rho, steps)
    check_micro_batch(micro_batch)
    dtype = _working_dtype(dtype)
    work = copy.deepcopy(model).to(dtype)
    batches_w = [(as_dtype(x, dtype), as_dtype(y, dtype)) for x, y in batches]
    with eval_mode(work):
        check_runs(work, *model_inputs(work, batches_w[0][0]), "the batches' inputs")
    if measure in ("hessian-trace", "lambda-max", "fisher"):
        if measure == "fisher":  # probes and sampled labels in canonical coordinates
            options = {"spec": _spec_of(model, batches, spec), **options}
        # the objective weighs batches by size: micro-batches of every batch are the same sum
        micro = [m for x, y in batches_w for m in split(x, y, micro_batch)]
        value = _curvature(measure, work, micro, loss_fn, seed, options)
        return Estimate(value, 0.0) if with_error else value
    if options:
        raise WsymInputError(f"unknown options for {measure!r}: {', '.join(options)}")
    if measure.startswith("geodesic"):
        spec = _spec_of(model, batches, spec)
        _move_to(work, _base_point(spec, work.state_dict(), average, dtype))
    params = {n: p.detach() for n, p in work.named_parameters() if p.requires_grad}
    geom = _geometry(spec, measure, params)
    fs = [_batch_loss(work, loss_fn, x, y, micro_batch) for x, y in batches_w]
    sizes = [batch_size(x) for x, _ in batches_w]
    weights = [n / sum(sizes) for n in sizes]
    with eval_mode(work):
        if average:
            value, err = average_case(geom, fs, weights, rho, steps, seed)
        else:
            value = sum(
                w * worst_case(geom, f, rho, steps) for f, w in zip(fs, weights, strict=True)
            )
            err = 0.0
    return Estimate(float(value), err) if with_error else float(value)


@dataclass(frozen=True)
class Estimate:
    """A sharpness value and its standard error (0 for deterministic measures)."""

    value: float
    stderr: float

    def __str__(self) -> str:
        return f"{self.value:.4g} +- {self.stderr:.2g}" if self.stderr else f"{self.value:.4g}"


def _batch_loss(model, loss_fn, inputs, targets, micro_batch) -> BatchLoss:
    n = batch_size(inputs)
    parts = split(inputs, targets, micro_batch, n)
    return BatchLoss(
        [lambda params, x=x, y=y: loss_fn(call(model, params, x), y) for x, y in parts],
        [batch_size(x) / n for x, _ in parts],
    )


#: Working precisions of the measures (the loss, the tangents, the setup's solves).
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _working_dtype(dtype) -> torch.dtype:
    """``dtype`` (a torch dtype or its name) as float32 / float64, or a one-line error."""
    resolved = DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if resolved not in DTYPES.values():
        raise WsymInputError(
            f"sharpness runs in float32 or float64, not {dtype}; pass dtype=torch.float32 "
            "(large models) or torch.float64 (references)"
        )
    return resolved


def _spec_of(model, batches, spec: SymmetrySpec | None) -> SymmetrySpec:
    from wsym.detect import spec_or_detect

    return spec_or_detect(spec, model, batches[0][0], "wsym.sharpness")


def _base_point(
    spec: SymmetrySpec, state: dict, average: bool, dtype: torch.dtype = torch.float64
) -> dict:
    """Where the geodesic measures are evaluated: a point of the same orbit.

    Worst case: the balanced point of the diagonal groups
    (:func:`wsym.sharpness.gauge.balanced`), where the quotient metric is invariant to
    the whole group, then balanced per GL block (``G^T G = H^T H``, the GL step of
    :func:`wsym.canonicalize`), where the Gram shift commutes with the remaining
    orthogonal group, so that the regularized metric is invariant too, nearly singular
    blocks included (``docs/geometry.md``, section 2.1). Average case: the canonical
    point (:func:`wsym.canonicalize`, which balances GL blocks alike), so that the random
    directions are drawn in canonical coordinates and transform with every element,
    permutations and signs included.
    """
    from wsym.align.canonicalize import canonical_element

    if average:
        return canonical_element(state, spec, dtype=dtype)[0]
    point = balanced(spec, state, dtype=dtype)
    return canonical_element(point, spec, kinds={"gl"}, max_sweeps=1, dtype=dtype)[0]


def _move_to(model: nn.Module, state: dict) -> None:
    """Load ``state`` (same function, another point of the orbit) into the working copy."""
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            if name in state and t.is_floating_point():
                t.copy_(state[name])


def _geometry(spec, measure, params) -> Perturbation:
    if measure == "euclidean":
        return Euclidean(params)
    if measure == "adaptive":
        return Adaptive(params)
    metric = "invariant" if measure == "geodesic-inv" else "mixed"
    geom = Geodesic(params, spec, metric)
    if not geom.blocks and not geom.horizontal.active:
        warnings.warn(
            f"{measure}: the spec has no continuous group; the measure equals 'adaptive'",
            SymmetryWarning,
            stacklevel=3,
        )
    return geom
