r"""The global branch of the meta-network: per-tensor statistics of the invariant weights.

StatNN (Unterthiner et al., 2020) showed that a handful of statistics per
weight tensor predict generalization well. This module computes a richer set
on the :func:`~wsym.metanet.invariant_form` weights, so every feature is
invariant to the whole spec (the canonical form removes the continuous groups
and signs; each statistic is a function of the multiset of entries, rows or
singular values, so permutations do not move it):

* every tensor ``t``: mean, variance, quantiles 0/25/50/75/100% of the entries,
  :math:`\|t\|_F` and :math:`\mathrm{mean}|t|` (9 numbers);
* every tensor with two or more axes, as the matrix ``M = t.reshape(out, -1)``:
  its three largest singular values, the nuclear norm, the stable rank
  :math:`\|M\|_F^2 / \sigma_1^2`, the smallest singular value and the
  quantiles 0/25/50/75/100% of the row norms and of the column norms (16 more).

:class:`QuantileNormal` maps each feature through its training-set empirical
CDF and the standard normal quantile function (a monotone, scale-free
standardization, as gradient boosting is scale-free), and
:class:`StatisticsEnsemble` averages a few small perceptrons on the result and,
optionally, blends them with gradient-boosted trees on the statistics (StatNN's
learner, :mod:`wsym.metanet.trees`).

Example:
    >>> t = torch.arange(6.0).reshape(2, 3)
    >>> statistic_width(t.shape), tensor_features(t).shape
    (25, torch.Size([25]))
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from wsym.metanet.trees import BoostedTrees

STAT_QUANTILES = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64)
TOP_SINGULAR = 3


def tensor_statistics(t: Tensor) -> Tensor:
    """``(7,)`` mean, variance and quantiles 0/25/50/75/100% of all entries of ``t``.

    Example:
        >>> tensor_statistics(torch.arange(5.0)).tolist()
        [2.0, 2.0, 0.0, 1.0, 2.0, 3.0, 4.0]
    """
    v = t.detach().to(torch.float64).reshape(-1)
    return torch.cat([v.mean()[None], v.var(unbiased=False)[None], v.quantile(STAT_QUANTILES)])


def _is_matrix(shape) -> bool:
    return len(shape) >= 2 and shape[0] > 1 and int(torch.tensor(shape[1:]).prod()) > 1


def statistic_width(shape) -> int:
    """Number of :func:`tensor_features` of a tensor of ``shape``."""
    return 9 + (6 + 2 * len(STAT_QUANTILES) if _is_matrix(tuple(shape)) else 0)


def tensor_features(t: Tensor) -> Tensor:
    """``(statistic_width(t.shape),)`` float64 statistics of one tensor (see the module doc)."""
    t = t.detach().to(torch.float64)
    v = t.reshape(-1)
    out = [tensor_statistics(v), torch.stack([v.norm(), v.abs().mean()])]
    if _is_matrix(tuple(t.shape)):
        m = t.reshape(t.shape[0], -1)
        s = torch.linalg.svdvals(m)
        top = torch.cat([s[:TOP_SINGULAR], s.new_zeros(max(0, TOP_SINGULAR - len(s)))])
        stable = (s**2).sum() / (s[0] ** 2).clamp(min=1e-300)
        out += [top, torch.stack([s.sum(), stable, s[-1]])]
        out += [m.norm(dim=1).quantile(STAT_QUANTILES), m.norm(dim=0).quantile(STAT_QUANTILES)]
    return torch.cat(out)


class QuantileNormal(nn.Module):
    r"""Per-feature :math:`z = \Phi^{-1}(\hat F(x))`, the empirical CDF interpolated between knots.

    ``knots (K, F)`` are the training quantiles at levels ``linspace(0, 1, K)``;
    values outside the training range saturate at levels ``1/(2K)`` and ``1 - 1/(2K)``.

    Example:
        >>> q = QuantileNormal(4, knots=5)
        >>> q.fit(torch.randn(100, 4))
        >>> q(torch.zeros(3, 4)).shape
        torch.Size([3, 4])
    """

    def __init__(self, features: int, knots: int = 64):
        super().__init__()
        self.register_buffer("knots", torch.linspace(-3, 3, knots)[:, None].repeat(1, features))

    def fit(self, x: Tensor) -> None:
        """Set the knots to the quantiles of ``x (n, F)``."""
        levels = torch.linspace(0, 1, len(self.knots), dtype=torch.float64)
        self.knots.copy_(torch.quantile(x.double(), levels, dim=0).to(self.knots.dtype))

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        k = self.knots.to(x.dtype).T.contiguous()  # (F, K)
        xv = x.T.contiguous()  # (F, B)
        n = k.shape[1]
        hi = torch.searchsorted(k, xv).clamp(1, n - 1)
        lo = hi - 1
        k_lo, k_hi = k.gather(1, lo), k.gather(1, hi)
        gap = k_hi - k_lo
        frac = torch.where(gap > 0, (xv - k_lo) / gap.clamp(min=1e-300), torch.full_like(xv, 0.5))
        u = (lo + frac.clamp(0, 1)) / (n - 1)
        u = u.clamp(0.5 / n, 1 - 0.5 / n)
        return torch.special.ndtri(u).T


class StatisticsEnsemble(nn.Module):
    r"""Perceptrons (dropout, one hidden layer) on quantile-normal features, blended with trees.

    :math:`f(x) = (1 - \beta)\,\mathrm{mean}_k\, \mathrm{MLP}_k(z(x)) + \beta\, T(x)`,
    with ``members`` perceptrons on the quantile-normal features :math:`z(x)`,
    ``trees`` boosted regression trees :math:`T` (one
    :class:`~wsym.metanet.trees.BoostedTrees` per output, on the raw features; none
    when ``trees=0``) and the blend weight :math:`\beta` (buffer ``blend``, chosen
    on validation members by :func:`wsym.metanet.fit`).

    Example:
        >>> m = StatisticsEnsemble(10, hidden=8, members=3)
        >>> m(torch.randn(4, 10)).shape
        torch.Size([4, 1])
    """

    def __init__(
        self,
        features: int,
        hidden: int = 64,
        members: int = 5,
        outputs: int = 1,
        dropout=0.1,
        trees: int = 0,
        tree_depth: int = 3,
    ):
        super().__init__()
        self.normal = QuantileNormal(features)
        self.members = nn.ModuleList(
            nn.Sequential(
                nn.Dropout(dropout / 2),
                nn.Linear(features, hidden),
                nn.SiLU(),
                nn.Dropout(dropout),
                nn.Linear(hidden, outputs),
            )
            for _ in range(members)
        )
        self.trees = nn.ModuleList(
            BoostedTrees(trees, tree_depth) for _ in range(outputs if trees else 0)
        )
        if trees:  # a buffer only with trees: files without them load unchanged
            self.register_buffer("blend", torch.zeros(()))

    def perceptrons(self, x: Tensor) -> Tensor:
        """``(B, outputs)`` mean of the perceptrons (``x`` cast to the branch's dtype)."""
        z = self.normal(x.to(self.normal.knots.dtype))
        return torch.stack([m(z) for m in self.members]).mean(0)

    def tree_features(self, x: Tensor) -> Tensor:
        r"""``x`` on the signed log scale :math:`\operatorname{asinh}(x)`, then cast.

        Monotone, so the trees' splits are those on ``x``; computed in float64
        first, as canonical forms of networks with nearly dead units have
        statistics beyond the float32 range (up to 1e83 on the mnist1d-cnn zoo).
        """
        return torch.asinh(x.double()).to(self.normal.knots.dtype)

    def boosted(self, x: Tensor) -> Tensor:
        """``(B, outputs)`` the boosted trees (zeros without trees)."""
        if not len(self.trees):
            return self.normal.knots.new_zeros(x.shape[0], self.members[0][-1].out_features)
        z = self.tree_features(x)
        return torch.cat([t(z) for t in self.trees], dim=1)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, outputs)`` from raw statistics ``x (B, F)`` (float64 preferred)."""
        if not len(self.trees):
            return self.perceptrons(x)
        beta = self.blend.to(self.normal.knots.dtype)
        return (1 - beta) * self.perceptrons(x) + beta * self.boosted(x)


def train_vector_model(
    net: nn.Module,
    x,
    y: Tensor,
    x_val,
    y_val: Tensor,
    *,
    epochs: int = 300,
    lr: float = 1e-3,
    batch_size: int = 32,
    weight_decay: float = 1e-4,
    patience: int = 40,
    seed: int = 0,
    rank_weight: float = 1.0,
) -> nn.Module:
    """AdamW on MSE + pairwise ranking loss, early stopping on validation Kendall tau.

    ``x`` is anything ``net`` takes with an index (``x[idx]``); ``y`` standardized
    ``(n,)`` or ``(n, k)`` (the ranking term and the tau use the first column).
    """
    from wsym.metanet.metrics import kendall_tau, pairwise_rank_loss

    def first(t):
        return t.reshape(len(t), -1)[:, 0]

    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    best = (-2.0, 0, copy.deepcopy(net.state_dict()))
    for epoch in range(1, epochs + 1):
        net.train()
        for idx in torch.randperm(len(y), generator=gen).split(batch_size):
            if len(idx) < 2:
                continue
            pred = net(x[idx]).reshape(y[idx].shape)
            loss = nn.functional.mse_loss(pred, y[idx])
            if rank_weight:
                loss = loss + rank_weight * pairwise_rank_loss(first(pred), first(y[idx]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            tau = kendall_tau(first(y_val), first(net(x_val)))
        if tau > best[0]:
            best = (tau, epoch, copy.deepcopy(net.state_dict()))
        elif epoch - best[1] >= patience:
            break
    net.load_state_dict(best[2])
    return net.eval()
