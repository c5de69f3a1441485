r"""Gradient-boosted regression trees as a torch module (fitted by scikit-learn).

StatNN (Unterthiner et al., 2020) predicts generalization with gradient
boosting on per-tensor weight statistics; on small zoos (a few hundred
members) boosted trees are often the strongest learner on such tabular
features, because they are invariant to any monotone rescaling of a feature
and pick the few informative ones. :class:`BoostedTrees` fits scikit-learn's
:class:`~sklearn.ensemble.GradientBoostingRegressor` and copies its trees into
buffers, so the fitted model is part of the meta-network's state dict (saved in
the same ``.safetensors`` file) and predicts without scikit-learn:

.. math:: f(x) = f_0 + \eta \sum_{t=1}^{T} v_t\big(\ell_t(x)\big),

with :math:`\ell_t(x)` the leaf of tree ``t`` that ``x`` falls into (go left
when :math:`x_{j} \le \theta` at every split) and :math:`v_t` its leaf values.

Shapes:
    buffers ``feature, left, right (T, M)``, ``threshold, value (T, M)`` with
    ``M = 2^{depth+1} - 1`` (trees padded to full size); input ``(B, F)``,
    output ``(B, 1)``.

Example:
    >>> x = torch.randn(64, 3, dtype=torch.float64)
    >>> y = x[:, 0] - 2 * (x[:, 1] > 0)
    >>> trees = BoostedTrees(trees=50, depth=2)
    >>> trees.fit(x, y, seed=0)
    >>> trees(x).shape, bool(((trees(x)[:, 0] - y) ** 2).mean() < 0.2 * y.var())
    (torch.Size([64, 1]), True)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class BoostedTrees(nn.Module):
    r"""``trees`` regression trees of depth ``depth``, boosted; fit with :meth:`fit`.

    Args:
        trees: number of boosting stages.
        depth: depth of every tree.
        learning_rate: shrinkage :math:`\eta`.
        subsample: share of training rows drawn for each tree (stochastic boosting).
    """

    def __init__(
        self, trees: int = 200, depth: int = 3, learning_rate: float = 0.05, subsample=0.8
    ):
        super().__init__()
        self.depth, self.learning_rate, self.subsample = depth, learning_rate, subsample
        m = 2 ** (depth + 1) - 1
        leaf = torch.arange(m).repeat(trees, 1)  # an unfitted tree: every node its own leaf
        self.register_buffer("feature", torch.zeros(trees, m, dtype=torch.long))
        self.register_buffer("threshold", torch.zeros(trees, m))
        self.register_buffer("left", leaf.clone())
        self.register_buffer("right", leaf.clone())
        self.register_buffer("value", torch.zeros(trees, m))
        self.register_buffer("offset", torch.zeros(()))

    def fit(self, x: Tensor, y: Tensor, seed: int = 0) -> None:
        """Fit on ``x (n, F)``, ``y (n,)`` (squared error) and copy the trees into the buffers."""
        from sklearn.ensemble import GradientBoostingRegressor

        model = GradientBoostingRegressor(
            n_estimators=len(self.feature),
            max_depth=self.depth,
            learning_rate=self.learning_rate,
            subsample=self.subsample,
            random_state=seed,
        )
        xn = x.detach().to(self.threshold.dtype).numpy()
        model.fit(xn, y.detach().double().reshape(-1).numpy())
        for t, est in enumerate(model.estimators_[:, 0]):
            tree = est.tree_
            n = tree.node_count
            leaf = torch.as_tensor(tree.children_left) < 0
            own = torch.arange(n)
            self.feature[t, :n] = torch.as_tensor(tree.feature).clamp(min=0)
            self.threshold[t, :n] = torch.as_tensor(tree.threshold, dtype=self.threshold.dtype)
            self.left[t, :n] = torch.where(leaf, own, torch.as_tensor(tree.children_left))
            self.right[t, :n] = torch.where(leaf, own, torch.as_tensor(tree.children_right))
            self.value[t, :n] = torch.as_tensor(tree.value.reshape(-1), dtype=self.value.dtype)
        self.offset.zero_()
        shift = torch.as_tensor(model.predict(xn[:1]), dtype=self.offset.dtype)[0]
        self.offset.fill_(float(shift - self(x[:1].to(self.threshold.dtype))[0, 0]))

    def forward(self, x: Tensor) -> Tensor:  # noqa: D102
        trees = len(self.feature)
        node = x.new_zeros(x.shape[0], trees, dtype=torch.long)
        rows = torch.arange(trees)
        for _ in range(self.depth):
            f, thr = self.feature[rows, node], self.threshold[rows, node]
            go_left = x.gather(1, f) <= thr.to(x.dtype)
            node = torch.where(go_left, self.left[rows, node], self.right[rows, node])
        leaves = self.value[rows, node].to(x.dtype)
        return (self.offset.to(x.dtype) + self.learning_rate * leaves.sum(1))[:, None]
