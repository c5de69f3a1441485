r"""Curvature of the loss in weight space: HVPs, Hessian trace, top eigenvalue, Fisher.

All functions take a model, a list of batches ``(inputs, targets)`` and, where a
Hessian is involved, ``loss_fn(outputs, targets)`` (a mean over the batch). The
objective is the sample-mean loss over the batches, evaluated functionally
(:func:`torch.func.functional_call` on a parameter dict) with the model in eval
mode: BatchNorm uses its running statistics and dropout is off. Derivatives are
``torch.func`` transforms: HVPs are forward-over-reverse (``jvp`` of ``grad``) by
default, or reverse-over-reverse (``vjp`` of ``grad``) with ``mode="reverse"``.

* :func:`gradient`, :func:`hvp` -- :math:`\nabla \mathcal{L}`, :math:`\nabla^2 \mathcal{L}\, v`.
* :func:`hessian_trace`, :func:`diagonal_hessian` -- Hutchinson (Rademacher, or exact).
* :func:`lambda_max` -- Lanczos with full reorthogonalization.
* :func:`diagonal_fisher`, :func:`kfac_factors` -- Fisher with sampled labels.
* :func:`fisher_riemannian_sharpness`, :func:`kfac_fisher_riemannian_sharpness` --
  :math:`\operatorname{Tr}(F^{-1} H)`.

Slow dense references for tests live in :mod:`wsym.testing.oracles.curvature`.
"""

from wsym.sharpness.curvature.fisher import diagonal_fisher, sample_labels
from wsym.sharpness.curvature.fisher_riemannian import (
    fisher_riemannian_sharpness,
    kfac_fisher_riemannian_sharpness,
)
from wsym.sharpness.curvature.hutchinson import diagonal_hessian, hessian_trace
from wsym.sharpness.curvature.kfac import KroneckerFactors, kfac_factors
from wsym.sharpness.curvature.lanczos import lambda_max
from wsym.sharpness.curvature.objective import gradient, hvp, hvp_many

__all__ = [
    "KroneckerFactors",
    "diagonal_fisher",
    "diagonal_hessian",
    "fisher_riemannian_sharpness",
    "gradient",
    "hessian_trace",
    "hvp",
    "hvp_many",
    "kfac_factors",
    "kfac_fisher_riemannian_sharpness",
    "lambda_max",
    "sample_labels",
]
