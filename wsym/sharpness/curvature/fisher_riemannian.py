r"""Fisher-Riemannian sharpness :math:`S_R = \operatorname{Tr}(F^{-1} \nabla^2 \mathcal{L})`.

The Hessian measured in the Fisher metric (Ahmed, Sarmah, Dutta 2026; see
``docs/geometry.md``). Two estimators:

* **diagonal** (:func:`fisher_riemannian_sharpness`):
  :math:`S_R \approx \sum_i \hat H_{ii} / (\hat F_{ii} + \delta)` with the
  Hutchinson diagonal :math:`\hat H` (:func:`~wsym.sharpness.curvature.diagonal_hessian`)
  and the sampled-label diagonal Fisher :math:`\hat F`
  (:func:`~wsym.sharpness.curvature.diagonal_fisher`).
  For a reparametrization :math:`\theta = D \phi` with diagonal :math:`D`, the exact
  diagonals transform as :math:`H^\phi_{ii} = D_{ii}^2 H_{ii}` and
  :math:`F^\phi_{ii} = D_{ii}^2 F_{ii}` (with the same sampled labels), so with
  ``damping=0`` and ``probes="exact"`` the estimate is exactly invariant to
  elementwise rescalings -- including the ReLU rescaling symmetry, which is one.
  Rademacher probes are invariant only in expectation (their off-diagonal noise
  :math:`v_i \sum_{j \ne i} H_{ij} v_j` scales as :math:`D_{ii} D_{jj}`), and
  damping breaks it at scale :math:`\delta`. It is not invariant to GL actions.
  Given the ``spec``, it is evaluated at the canonical point of the orbit
  (:func:`wsym.canonicalize`), like the average-case geodesic measures: the probes are
  drawn in canonical coordinates, so they are transported with the units, and the
  estimate is exactly invariant to permutations as well (the sampled labels depend on
  the function only).
* **K-FAC** (:func:`kfac_fisher_riemannian_sharpness`):
  :math:`S_R \approx \frac1m \sum_j v_j^\top (\tilde F + \delta I)^{-1} H v_j`,
  Rademacher :math:`v_j`, where :math:`\tilde F` is block diagonal: for each
  ``nn.Linear`` (weight and bias together) the K-FAC block :math:`A \otimes G` of
  :mod:`wsym.sharpness.curvature.kfac` with exact damping; every other parameter its own
  diagonal Fisher entry :math:`\hat F_{ii}`. Since :math:`(\tilde F + \delta I)^{-1}`
  is symmetric, this is an unbiased Hutchinson estimate of
  :math:`\operatorname{Tr}((\tilde F + \delta I)^{-1} H)`; ``probes="exact"``
  gives the trace exactly.

Both use the mean loss over the batches (eval mode) for :math:`H` and cross-entropy
with labels sampled from the model's softmax for :math:`F` (classification only).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from wsym.group.spec import SymmetrySpec
from wsym.sharpness.curvature.fisher import Samples, diagonal_fisher
from wsym.sharpness.curvature.hutchinson import (
    Probes,
    diagonal_hessian,
    hessian_probe_products,
    probe_scale,
)
from wsym.sharpness.curvature.kfac import kfac_factors
from wsym.sharpness.curvature.objective import Batch, HvpMode, LossFn, Params, model_params


def fisher_riemannian_sharpness(
    model: nn.Module,
    batches: Sequence[Batch],
    loss_fn: LossFn,
    damping: float = 1e-3,
    probes: Probes = 100,
    seed: int = 0,
    fisher_samples: Samples = 1,
    params: Params | None = None,
    mode: HvpMode = "reverse",
    relative: bool = False,
    spec: SymmetrySpec | None = None,
) -> float:
    r"""Diagonal estimator :math:`\sum_i \hat H_{ii} / (\hat F_{ii} + \delta)`.

    With ``relative=True`` the damping is relative to each weight,
    :math:`\sum_i \theta_i^2 \hat H_{ii} / (\theta_i^2 \hat F_{ii} + \delta)` (the
    same sum in the adaptive coordinates :math:`\theta = |\theta_0| \odot \phi`), and
    the Hutchinson probes are scaled by :math:`\theta`: the estimate is then exactly
    invariant, for a fixed seed, to elementwise rescalings and sign flips (ReLU
    rescaling, BatchNorm input scaling, odd-activation signs) where no weight is
    exactly zero (zero entries take unit probe scale). With ``spec`` as well, it is
    taken at the canonical point (:func:`wsym.canonicalize`), where the probes are
    drawn in canonical coordinates: then it is exactly invariant to permutations too
    (without ``spec``, only in distribution).

    Args:
        model: a classifier returning logits ``(N, C)``; evaluated in eval mode.
        batches: list of ``(inputs, targets)``.
        loss_fn: ``loss_fn(outputs, targets)``, a mean over the batch (for :math:`H`).
        damping: :math:`\delta > 0` keeps the ratio finite where :math:`\hat F_{ii} = 0`.
        probes: Hutchinson probes for :math:`\hat H`, or ``"exact"``.
        seed: seeds both the probes and the sampled labels; same seed, same value.
        fisher_samples: labels drawn per input for :math:`\hat F`, or ``"exact"``.
        params: ``{name: tensor}``; ``None`` takes the model's.
        mode: HVP mode, ``"forward"`` or ``"reverse"`` (see :func:`~wsym.sharpness.curvature.hvp`).
        relative: damping relative to each weight, probes scaled by the weights.
        spec: the model's symmetries; given, the estimate is taken at the canonical
            point of the orbit (on a copy of the model; the model is not modified).

    Returns:
        The estimate as a Python float.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> model, x = nn.Linear(3, 2), torch.randn(8, 3)
        >>> batches = [(x, torch.randint(0, 2, (8,)))]
        >>> s = fisher_riemannian_sharpness(model, batches, nn.CrossEntropyLoss(), probes="exact")
        >>> s > 0
        True
    """
    params = model_params(model) if params is None else params
    if spec is not None:
        model, params = canonical_point(model, params, spec)
    scale = {n: p.detach() for n, p in params.items()} if relative else None
    hess = diagonal_hessian(model, batches, loss_fn, probes, seed, params, mode=mode, scale=scale)
    fisher = diagonal_fisher(model, batches, fisher_samples, seed, params)
    if relative:
        sq = {n: p.detach() ** 2 for n, p in params.items()}
        return float(sum((sq[n] * hess[n] / (sq[n] * fisher[n] + damping)).sum() for n in params))
    return float(sum((hess[n] / (fisher[n] + damping)).sum() for n in params))


def canonical_point(
    model: nn.Module, params: Params, spec: SymmetrySpec
) -> tuple[nn.Module, Params]:
    """A copy of ``model`` and ``params`` moved to the canonical point of their orbit.

    Buffers (BatchNorm running statistics, which norm_scaling groups move) move with
    the parameters; every tensor keeps its dtype.
    """
    from wsym.align.canonicalize import canonical_element

    state = {**model.state_dict(), **{n: p.detach() for n, p in params.items()}}
    canon, _ = canonical_element(state, spec)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for key, t in moved.state_dict(keep_vars=True).items():
            if key in canon and t.is_floating_point():
                t.copy_(canon[key].to(t.dtype))
    return moved, {n: canon[n].to(p.dtype) for n, p in params.items()}


def kfac_fisher_riemannian_sharpness(
    model: nn.Module,
    batches: Sequence[Batch],
    loss_fn: LossFn,
    damping: float = 1e-3,
    probes: Probes = 100,
    seed: int = 0,
    fisher_samples: Samples = 1,
    params: Params | None = None,
    mode: HvpMode = "reverse",
) -> float:
    r"""K-FAC estimator :math:`\frac1m \sum_j v_j^\top (\tilde F + \delta I)^{-1} H v_j`.

    Args:
        model: a classifier returning logits ``(N, C)``; evaluated in eval mode.
        batches: list of ``(inputs, targets)``.
        loss_fn: ``loss_fn(outputs, targets)``, a mean over the batch (for :math:`H`).
        damping: :math:`\delta > 0`, added exactly to each block.
        probes: Hutchinson probes, or ``"exact"`` (basis vectors: the exact trace).
        seed: seeds both the probes and the sampled labels; same seed, same value.
        fisher_samples: labels drawn per input for :math:`\tilde F`, or ``"exact"``.
        params: ``{name: tensor}``; ``None`` takes the model's.
        mode: HVP mode, ``"forward"`` or ``"reverse"`` (see :func:`~wsym.sharpness.curvature.hvp`).

    Returns:
        The estimate as a Python float.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> model, x = nn.Linear(3, 2), torch.randn(8, 3)
        >>> batches = [(x, torch.randint(0, 2, (8,)))]
        >>> s = kfac_fisher_riemannian_sharpness(model, batches, nn.CrossEntropyLoss())
        >>> s > 0
        True
    """
    params = model_params(model) if params is None else params
    factors = kfac_factors(model, batches, fisher_samples, seed, params)
    covered = {n for f in factors.values() for n in (f.weight, f.bias) if n is not None}
    rest = {n: p for n, p in params.items() if n not in covered}
    fisher = diagonal_fisher(model, batches, fisher_samples, seed, rest) if rest else {}
    total = 0.0
    for vs, hvs in hessian_probe_products(model, params, batches, loss_fn, probes, seed, 16, mode):
        solved = {n: hvs[n] / (fisher[n] + damping) for n in rest}
        for f in factors.values():
            bias = hvs[f.bias] if f.bias is not None else None
            solved[f.weight], b = f.inverse_product(hvs[f.weight], bias, damping)
            if f.bias is not None:
                solved[f.bias] = b
        total += float(sum((vs[n] * solved[n]).sum() for n in params))
    return total * probe_scale(probes)
