"""Boosted trees in the statistics branch: equal to scikit-learn, invariant, saved, finite."""

from __future__ import annotations

import pytest
import torch
from cases import fit_scaled_mlps, scaled_mlp_population

pytest.importorskip("torch_geometric")
pytest.importorskip("sklearn")

import wsym
from wsym.metanet import kendall_tau, load
from wsym.metanet.baselines import Metanet, StatNN
from wsym.metanet.fit import BLENDS
from wsym.metanet.layers import stat_input
from wsym.metanet.statistics import StatisticsEnsemble
from wsym.metanet.trees import BoostedTrees
from wsym.models.networks import MLP
from wsym.testing import assert_invariant


def test_trees_equal_scikit_learn_in_float64():
    from sklearn.ensemble import GradientBoostingRegressor

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 6, generator=gen, dtype=torch.float64)
    y = x[:, 0] * x[:, 1] + (x[:, 2] > 0.3) + 0.1 * torch.randn(200, generator=gen)
    trees = BoostedTrees(trees=40, depth=3).double()
    trees.fit(x, y, seed=3)
    ref = GradientBoostingRegressor(
        n_estimators=40, max_depth=3, learning_rate=0.05, subsample=0.8, random_state=3
    ).fit(x.numpy(), y.numpy())
    x_new = torch.randn(50, 6, generator=gen, dtype=torch.float64)
    expected = torch.as_tensor(ref.predict(x_new.numpy()))
    assert torch.allclose(trees(x_new)[:, 0], expected, atol=1e-9)
    unfitted = BoostedTrees(trees=3, depth=2)
    assert torch.equal(unfitted(x_new.float()), torch.zeros(50, 1))


@pytest.fixture(scope="module")
def with_trees():
    sds, y = scaled_mlp_population(40)
    p = fit_scaled_mlps(
        sds[:32],
        y[:32],
        epochs=0,
        trees=30,
        stat_epochs=60,
        seed=0,
    )
    return p, sds, y


def test_fit_with_trees_blends_on_validation(with_trees):
    p, sds, y = with_trees
    rep = p.config["report"]
    assert rep["blend"] in BLENDS and set(rep["blend_val_taus"]) == set(BLENDS)
    assert rep["statistics_val_tau"] == max(rep["blend_val_taus"].values())
    assert kendall_tau(y[32:], p.predict(sds[32:])) > 0.5


def test_trees_saved_and_prediction_invariant(with_trees, tmp_path):
    p, sds, _ = with_trees
    p.save(tmp_path / "m.safetensors")
    q = load(tmp_path / "m.safetensors")
    assert q.config["trees"] == 30 and float(q.net.stats.blend) == p.config["report"]["blend"]
    assert torch.allclose(q.predict(sds[32:]), p.predict(sds[32:]), atol=1e-6)
    sd = {k: v.double() for k, v in sds[0].items()}
    assert_invariant(lambda s: q.double().predict(s), q.spec, sd, tol=1e-5, seeds=(0, 1))


def test_tree_features_finite_beyond_float32():
    class Batch:
        stat_attr = torch.tensor([[1e83, -1e41, 0.5]], dtype=torch.float64)

    x = StatisticsEnsemble(3, trees=2).tree_features(stat_input(Batch))
    assert x.dtype == torch.float32 and torch.isfinite(x).all()
    assert x[0, 0] > x[0, 2] > 0 > x[0, 1]


def test_baseline_caches_hold_their_state_dicts():
    sds, y = scaled_mlp_population(12)
    spec = wsym.detect(MLP(4, [6], 3), torch.randn(2, 4))
    cache = {}
    m = Metanet(spec, cache=cache, epochs=0, stat_epochs=5)
    m.fit(sds[:8], y[:8], sds[8:10], y[8:10])
    assert len(cache) == 10
    a = m.predict([{k: v * 2 for k, v in sds[10].items()}])  # a temporary dict ...
    b = m.predict([{k: v * 0.5 for k, v in sds[10].items()}])  # ... whose id may be reused
    assert not torch.equal(a, b)
    statnn = StatNN(spec, canonical=True, cache={})
    statnn.fit(sds[:8], y[:8], sds[8:10], y[8:10])
    assert len(statnn.cache) == 8 and statnn.predict(sds[10:]).shape == (2,)


def test_fit_finite_with_dead_units_of_huge_canonical_scale():
    sds, y = scaled_mlp_population(16)
    sds = [{k: v.double() for k, v in sd.items()} for sd in sds]
    sds[0] = {k: v * 1e60 for k, v in sds[0].items()}  # beyond float32 after balancing
    p = fit_scaled_mlps(
        sds[:12],
        y[:12],
        epochs=2,
        stat_epochs=5,
        trees=5,
        seed=0,
    )
    assert torch.isfinite(p.predict(sds)).all()
