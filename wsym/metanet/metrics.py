"""Scores of a predictor on held-out members: Kendall tau and the coefficient of determination.

Example:
    >>> import torch
    >>> y = torch.tensor([0.1, 0.4, 0.2, 0.9])
    >>> kendall_tau(y, 2 * y), round(r2(y, y), 6)
    (1.0, 1.0)
"""

from __future__ import annotations

import math

import torch
from scipy.stats import kendalltau


def kendall_tau(target, prediction) -> float:
    """Kendall's tau-b rank correlation (nan-safe: 0 for a constant prediction)."""
    t = torch.as_tensor(target, dtype=torch.float64).reshape(-1).numpy()
    p = torch.as_tensor(prediction, dtype=torch.float64).reshape(-1).numpy()
    tau = kendalltau(t, p).statistic
    return 0.0 if tau is None or math.isnan(tau) else float(tau)


def r2(target, prediction) -> float:
    """``1 - sum (y - p)^2 / sum (y - mean y)^2``."""
    t = torch.as_tensor(target, dtype=torch.float64).reshape(-1)
    p = torch.as_tensor(prediction, dtype=torch.float64).reshape(-1)
    den = float(((t - t.mean()) ** 2).sum())
    return 1.0 - float(((t - p) ** 2).sum()) / den if den > 0 else float("nan")


def pairwise_rank_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean of ``softplus(-(p_i - p_j) sign(y_i - y_j))`` over pairs with ``y_i != y_j``."""
    dp = prediction[:, None] - prediction[None, :]
    sign = torch.sign(target[:, None] - target[None, :])
    mask = sign != 0
    if not mask.any():
        return prediction.sum() * 0
    return torch.nn.functional.softplus(-dp[mask] * sign[mask]).mean()
