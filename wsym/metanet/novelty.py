r"""How far a checkpoint lies from the members a meta-network was trained on.

A meta-network's prediction is an interpolation between its training members;
a checkpoint of another task or initialization lies elsewhere and gets a number
with nothing behind it. :class:`TrainingDistribution` summarizes the training
members' invariant weight statistics (the statistics branch's inputs, ``stat_x``
or ``stat_attr``), and scores a new checkpoint by a Mahalanobis distance under a
probabilistic-PCA covariance (Tipping and Bishop, 1999):

* each feature on the signed log scale :math:`t = \operatorname{asinh}(x)` (the
  statistics span dozens of orders of magnitude), standardized by the training
  mean and standard deviation (floored at :data:`SCALE_FLOOR`): :math:`z`;
* the top :data:`COMPONENTS` principal directions :math:`v_i` of the training
  :math:`z` with their variances :math:`\lambda_i`, the rest of the space with the
  mean remaining variance :math:`\sigma^2`:
  :math:`d^2 = \frac{1}{F}\big(\sum_i (v_i^\top z)^2/\lambda_i
  + (\lVert z\rVert^2 - \sum_i (v_i^\top z)^2)/\sigma^2\big)`;
* the threshold: the :data:`QUANTILE` quantile of the training members'
  *out-of-fold* distances (:data:`FOLDS` folds; in-sample distances are optimistic
  in a few hundred dimensions), so about 1% of members like the training ones
  are flagged.

Holds ``(COMPONENTS + 2) x F`` numbers; serialized as JSON in the predictor file.

Example:
    >>> import torch
    >>> x = torch.randn(200, 6, dtype=torch.float64)
    >>> d = TrainingDistribution.fit(x)
    >>> far = d.check(50 + x[:1])["out_of_distribution"]
    >>> bool(d.check(x[:1])["out_of_distribution"]), bool(far)
    (False, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

COMPONENTS = 16
QUANTILE = 0.99
FOLDS = 5
SCALE_FLOOR = 0.1


@dataclass(frozen=True)
class TrainingDistribution:
    """Mean, scale and principal directions of training statistics, and the threshold."""

    mean: Tensor  # (F,) of asinh(x)
    scale: Tensor  # (F,)
    directions: Tensor  # (k, F)
    variances: Tensor  # (k,)
    residual: float
    threshold: float

    @classmethod
    def fit(cls, x: Tensor, quantile: float = QUANTILE) -> TrainingDistribution:
        """Fit on training statistics ``x (n, F)``; the threshold from out-of-fold distances."""
        x = x.detach().double()
        n = len(x)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
        oof = torch.empty(n, dtype=torch.float64)
        folds = min(FOLDS, n)
        for k in range(folds):
            held = order[k::folds]
            keep = torch.ones(n, dtype=torch.bool)
            keep[held] = False
            oof[held] = _moments(x[keep]).distance(x[held]) if keep.sum() > 1 else 0.0
        return _moments(x, float(oof.quantile(quantile)))

    def distance(self, x: Tensor) -> Tensor:
        """``(n,)`` distances of statistics ``x (n, F)`` (1 is a typical training member's)."""
        z = (torch.asinh(x.detach().double()) - self.mean) / self.scale
        p = z @ self.directions.T
        inside = (p**2 / self.variances).sum(1)
        rest = ((z**2).sum(1) - (p**2).sum(1)).clamp(min=0) / self.residual
        return ((inside + rest) / z.shape[1]).sqrt()

    def check(self, x: Tensor) -> dict:
        """``{"out_of_distribution", "distance", "threshold"}`` of the first row of ``x``."""
        d = float(self.distance(x[:1])[0])
        return {
            "out_of_distribution": d > self.threshold,
            "distance": d,
            "threshold": self.threshold,
        }

    def to_json(self) -> dict:
        """Plain lists and floats (the predictor file's metadata)."""
        return {
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "directions": self.directions.tolist(),
            "variances": self.variances.tolist(),
            "residual": self.residual,
            "threshold": self.threshold,
        }

    @classmethod
    def from_json(cls, data: dict | None) -> TrainingDistribution | None:
        """Inverse of :meth:`to_json`; ``None`` stays ``None`` (files written without it)."""
        if data is None:
            return None
        f64 = torch.float64
        return cls(
            torch.tensor(data["mean"], dtype=f64),
            torch.tensor(data["scale"], dtype=f64),
            torch.tensor(data["directions"], dtype=f64).reshape(-1, len(data["mean"])),
            torch.tensor(data["variances"], dtype=f64),
            float(data["residual"]),
            float(data["threshold"]),
        )


def _moments(x: Tensor, threshold: float = float("inf")) -> TrainingDistribution:
    t = torch.asinh(x)
    mean, scale = t.mean(0), t.std(0).nan_to_num(0.0).clamp(min=SCALE_FLOOR)
    z = (t - mean) / scale
    _, s, v = torch.linalg.svd(z - z.mean(0), full_matrices=False)
    lam = s**2 / max(len(z) - 1, 1)
    k = min(COMPONENTS, max(len(lam) - 1, 1))
    rest = lam[k:].mean() if len(lam) > k else lam.new_tensor(SCALE_FLOOR**2)
    floor = SCALE_FLOOR**2
    return TrainingDistribution(
        mean, scale, v[:k], lam[:k].clamp(min=floor), float(rest.clamp(min=floor)), threshold
    )
