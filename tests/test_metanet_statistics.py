"""The statistics branch: invariant per-tensor features, quantile-normal map, ensemble, training."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch_geometric")

from wsym.metanet.metrics import kendall_tau
from wsym.metanet.statistics import (
    QuantileNormal,
    StatisticsEnsemble,
    statistic_width,
    tensor_features,
    tensor_statistics,
    train_vector_model,
)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 6),
    kernel=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_features_invariant_to_permuting_rows_and_columns(rows, cols, kernel, seed):
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(rows, cols, kernel, generator=gen, dtype=torch.float64)
    moved = t[torch.randperm(rows, generator=gen)][:, torch.randperm(cols, generator=gen)]
    f = tensor_features(t)
    assert f.shape == (statistic_width(t.shape),)
    assert torch.allclose(f, tensor_features(moved), atol=1e-10, rtol=1e-10)


def test_features_of_a_known_matrix():
    m = torch.diag(torch.tensor([3.0, 1.0])).double()  # singular values 3, 1; rows norms 3, 1
    f = tensor_features(m)
    assert torch.equal(f[:7], tensor_statistics(m))
    assert f[7:9].tolist() == pytest.approx([10**0.5, 1.0])  # Frobenius norm, mean |m|
    assert f[9:15].tolist() == pytest.approx([3.0, 1.0, 0.0, 4.0, 10 / 9, 1.0])
    assert f[15:20].tolist() == pytest.approx([1.0, 1.5, 2.0, 2.5, 3.0])  # row-norm quantiles
    assert statistic_width((5,)) == 9 and statistic_width((1, 4)) == 9


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_quantile_normal_is_monotone_and_standardizes(seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(200, 3, generator=gen) * torch.tensor([1e-3, 1.0, 1e3]) + 5
    q = QuantileNormal(3, knots=32)
    q.fit(x)
    z = q(x)
    assert z.abs().max() < 3.0 and (z.mean(0).abs() < 0.2).all()
    probe = torch.sort(torch.randn(50, 3, generator=gen) * x.std(0) * 2 + x.mean(0), 0).values
    assert (q(probe).diff(dim=0) >= 0).all()  # monotone, saturating outside the range


def test_ensemble_learns_a_monotone_target():
    torch.manual_seed(0)
    x = torch.randn(120, 6)
    y = x[:, 0] ** 3 + 0.1 * x[:, 1]
    z = (y - y.mean()) / y.std()
    m = StatisticsEnsemble(6, hidden=16, members=2)
    m.normal.fit(x[:80])
    q = m.normal(x)
    for j, member in enumerate(m.members):
        train_vector_model(member, q[:80], z[:80], q[80:100], z[80:100], epochs=60, seed=j)
    with torch.no_grad():
        assert kendall_tau(y[100:], m(x[100:])[:, 0]) > 0.7
