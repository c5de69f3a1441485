"""wsym.optim: each optimizer descends, perturbs by rho in its own metric, protects BatchNorm."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

import wsym
from wsym.errors import WsymInputError
from wsym.models.networks import MLP
from wsym.optim import (
    ASAM,
    LLQRSAM,
    SAM,
    DiagonalFisher,
    FisherSAM,
    FixedDiagonal,
    GeoSAM,
    KroneckerFisher,
)
from wsym.optim.base import global_norm
from wsym.sharpness.curvature import diagonal_fisher


def _regression(seed=0, n=32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=gen, dtype=torch.float64)
    return x, torch.randn(n, 2, generator=gen, dtype=torch.float64)


def _classification(seed=0, n=32, d=5, classes=3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, classes, (n,), generator=gen)


def _closure(opt, model, x, y, loss_fn):
    def closure():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss

    return closure


def _mse(out, y):
    return ((out - y) ** 2).mean()


def _linear(seed=0):
    torch.manual_seed(seed)
    return nn.Linear(5, 2).double()


def _make(name, model, x, **kw):
    lr = kw.pop("lr", 0.05)
    if name == "sam":
        return SAM(model, rho=0.05, lr=lr, **kw)
    if name == "asam":
        return ASAM(model, rho=0.5, lr=lr, **kw)
    if name == "fisher":
        return FisherSAM(model, rho=0.05, lr=lr, **kw)
    if name == "geo":
        return GeoSAM(model, rho=0.05, lr=lr, example_inputs=x, **kw)
    if name == "llqr-fixed":
        u = {n: torch.rand_like(p) + 0.5 for n, p in model.named_parameters()}
        return LLQRSAM(model, rho=0.05, lr=lr, preconditioner=FixedDiagonal(u), **kw)
    if name.startswith("llqr-"):
        return LLQRSAM(model, rho=0.05, lr=lr, preconditioner=name[5:], refresh=2, **kw)
    raise ValueError(name)


@pytest.mark.parametrize("name", ["sam", "asam", "fisher", "llqr-fixed"])
@pytest.mark.parametrize("base", [torch.optim.SGD, torch.optim.Adam])
def test_step_decreases_convex_quadratic(name, base):
    x, y = _regression()
    model = _linear()
    opt = _make(name, model, x, base_optimizer=base, lr=0.01)
    closure = _closure(opt, model, x, y, _mse)
    before = float(opt.step(closure).detach())
    with torch.no_grad():
        assert float(_mse(model(x), y)) < before


@pytest.mark.parametrize(
    "name", ["llqr-fisher-diagonal", "llqr-fisher-kfac", "llqr-diagonal", "llqr-kfac"]
)
def test_llqr_step_decreases_convex_logistic_loss(name):
    x, y = _classification()
    torch.manual_seed(0)
    model = nn.Linear(5, 3).double()
    opt = _make(name, model, x, lr=0.1)
    closure = _closure(opt, model, x, y, F.cross_entropy)
    losses = [float(opt.step(closure).detach()) for _ in range(5)]
    assert losses[-1] < losses[0]


def test_geosam_decreases_loss_of_relu_mlp():
    x, y = _classification()
    torch.manual_seed(0)
    model = MLP(5, [8], 3).double()
    opt = _make("geo", model, x, lr=0.1)
    closure = _closure(opt, model, x, y, F.cross_entropy)
    losses = [float(opt.step(closure).detach()) for _ in range(5)]
    assert losses[-1] < losses[0]


def _grads(model, x, y, loss_fn):
    model.zero_grad()
    loss_fn(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.floats(1e-3, 1.0))
def test_sam_asam_fisher_perturbation_has_norm_rho_in_own_metric(seed, rho):
    x, y = _regression(seed)
    model = _linear(seed)
    params = list(model.parameters())
    g = _grads(model, x, y, _mse)
    eps = SAM(model, rho=rho, lr=0.1).perturbation(params, g)
    assert float(global_norm(eps)) == pytest.approx(rho, rel=1e-9)
    asam = ASAM(model, rho=rho, lr=0.1)
    eps = asam.perturbation(params, g)
    assert float(
        global_norm([e / asam.scale(p) for e, p in zip(eps, params, strict=True)])
    ) == pytest.approx(rho, rel=1e-9)
    fisher = FisherSAM(model, rho=rho, lr=0.1)
    eps = fisher.perturbation(params, g)
    metric = fisher.metric(g)
    norm = sum((e * f * e).sum() for e, f in zip(eps, metric, strict=True)) ** 0.5
    assert float(norm) == pytest.approx(rho, rel=1e-9)


@pytest.mark.parametrize("kind", ["fisher-diagonal", "fisher-kfac", "diagonal", "kfac"])
def test_llqr_perturbation_has_norm_rho_in_metric_u_inverse(kind):
    x, y = _classification()
    torch.manual_seed(0)
    model = MLP(5, [6], 3).double()
    opt = LLQRSAM(model, rho=0.3, lr=0.1, preconditioner=kind)
    params = list(model.parameters())
    g = _grads(model, x, y, F.cross_entropy)  # the forward hook records x
    eps = opt.perturbation(params, g)
    ug = opt.precondition(g)
    # eps = c U g with c > 0, and eps^T U^-1 eps = c^2 g^T U g = rho^2
    c = float(
        sum((e * u).sum() for e, u in zip(eps, ug, strict=True)) / sum((u * u).sum() for u in ug)
    )
    assert c > 0
    for e, u in zip(eps, ug, strict=True):
        torch.testing.assert_close(e, c * u)
    quad = float(sum((gi * u).sum() for gi, u in zip(g, ug, strict=True)))
    assert c * c * quad == pytest.approx(0.3**2, rel=1e-9)
    opt.normalize = "euclidean"
    assert float(global_norm(opt.perturbation(params, g))) == pytest.approx(0.3, rel=1e-9)


def test_kfac_preconditioner_matches_dense_inverse():
    x, _ = _classification()
    torch.manual_seed(0)
    model = nn.Linear(5, 3).double()
    params = {n: p.detach() for n, p in model.named_parameters()}
    pre = KroneckerFisher(damping=0.1, normalize=None)
    pre.estimate(model, params, x)
    _, _, A, G = pre.factors[""]
    dense = torch.kron(A, G)  # column-major vec of [W | b] (3 x 6)
    delta = 0.1 * torch.linalg.eigvalsh(A).clamp_min(0).mean() * torch.linalg.eigvalsh(G).mean()
    gw, gb = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    vec = torch.cat([gw, gb[:, None]], 1).T.reshape(-1)
    ref = torch.linalg.solve(dense + delta * torch.eye(18, dtype=torch.float64), vec)
    ref = ref.reshape(6, 3).T
    out = pre.apply({"weight": gw, "bias": gb})
    torch.testing.assert_close(out["weight"], ref[:, :5])
    torch.testing.assert_close(out["bias"], ref[:, 5])


def test_diagonal_preconditioner_is_scaled_damped_inverse_fisher():
    x, _ = _classification()
    torch.manual_seed(0)
    model = nn.Linear(5, 3).double()
    params = {n: p.detach() for n, p in model.named_parameters()}
    pre = DiagonalFisher(damping=0.01)
    pre.estimate(model, params, x)
    fisher = diagonal_fisher(model, [(x, None)], 1, 0, params)
    mean = torch.cat([f.reshape(-1) for f in fisher.values()]).mean()
    inv = {n: 1 / (f + 0.01 * mean) for n, f in fisher.items()}
    for n in params:  # U = 1 at the mean curvature
        torch.testing.assert_close(pre.diagonal[n], inv[n] * (1 + 0.01) * mean)
    trace = DiagonalFisher(damping=0.01, normalize="trace")
    trace.estimate(model, params, x)
    assert float(torch.cat([u.reshape(-1) for u in trace.diagonal.values()]).mean()) == (
        pytest.approx(1.0)
    )


class _Counting(FixedDiagonal):
    def __init__(self, diagonal):
        super().__init__(diagonal)
        self.calls = 0

    def estimate(self, model, params, inputs, output_grad=None):
        self.calls += 1


def test_llqr_refreshes_every_k_steps_as_moving_average():
    x, y = _classification()
    torch.manual_seed(0)
    model = nn.Linear(5, 3).double()
    pre = _Counting({n: torch.ones_like(p) for n, p in model.named_parameters()})
    opt = LLQRSAM(model, rho=0.05, lr=0.1, preconditioner=pre, refresh=3)
    closure = _closure(opt, model, x, y, F.cross_entropy)
    for _ in range(7):
        opt.step(closure)
    assert pre.calls == 3  # steps 0, 3, 6
    ema = DiagonalFisher(beta=0.5)
    params = {n: p.detach() for n, p in model.named_parameters()}
    ema.estimate(model, params, x)
    first = {n: u.clone() for n, u in ema.diagonal.items()}
    ema.estimate(model, params, x)
    fresh = DiagonalFisher()
    fresh.refreshes = 1  # same label draw as ema's second estimate
    fresh.estimate(model, params, x)
    for n in params:
        torch.testing.assert_close(ema.diagonal[n], 0.5 * first[n] + 0.5 * fresh.diagonal[n])


def test_geosam_perturbation_norm_and_equivariance():
    x, y = _classification()
    torch.manual_seed(0)
    model = MLP(5, [6], 3).double()
    spec = wsym.detect(model, x)
    opt = GeoSAM(model, rho=0.1, lr=0.1, spec=spec)
    params = list(model.parameters())
    eps = opt.perturbation(params, _grads(model, x, y, F.cross_entropy))
    assert any(float(e.abs().max()) > 0 for e in eps)
    # equivariance: perturbing a rescaled copy gives the rescaled perturbed point
    g = spec.sample(seed=3, scale=(0.2, 5.0), kinds=("scaling",))
    other = copy.deepcopy(model)
    other.load_state_dict(spec.act(g, model.state_dict()))
    opt2 = GeoSAM(other, rho=0.1, lr=0.1, spec=spec)
    eps2 = opt2.perturbation(list(other.parameters()), _grads(other, x, y, F.cross_entropy))
    names = [n for n, _ in model.named_parameters()]
    plus = {n: p.detach() + e for n, p, e in zip(names, params, eps, strict=True)}
    plus2 = {n: p.detach() + e for n, p, e in zip(names, other.parameters(), eps2, strict=True)}
    moved = spec.act(g, plus)
    for n in names:
        torch.testing.assert_close(plus2[n], moved[n], rtol=1e-6, atol=1e-9)


def test_batchnorm_statistics_updated_once_per_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 3)).double()
    reference = copy.deepcopy(model)
    x, y = _classification()
    reference.train()
    reference(x)  # one forward at theta: the statistics a plain step records
    for cls in (SAM, ASAM, FisherSAM):
        net = copy.deepcopy(model)
        opt = cls(net, rho=0.5, lr=0.1)
        opt.step(_closure(opt, net, x, y, F.cross_entropy))
        bn, ref = net[1], reference[1]
        torch.testing.assert_close(bn.running_mean, ref.running_mean)
        torch.testing.assert_close(bn.running_var, ref.running_var)
        assert int(bn.num_batches_tracked) == 1
    net = copy.deepcopy(model)  # built from parameters: the ascent pass updates them too
    opt = SAM(net.parameters(), rho=0.5, lr=0.1)
    opt.step(_closure(opt, net, x, y, F.cross_entropy))
    assert int(net[1].num_batches_tracked) == 2


def test_bad_hyperparameters_raise_clear_errors():
    model = _linear()
    for rho in (0, -0.1, float("nan")):
        with pytest.raises(WsymInputError, match="rho must be a positive number"):
            SAM(model, rho=rho, lr=0.1)
    with pytest.raises(WsymInputError, match="eta"):
        ASAM(model, eta=-1.0, lr=0.1)
    for k in (0, -3, 1.5):
        with pytest.raises(WsymInputError, match="refresh"):
            LLQRSAM(model, refresh=k, lr=0.1)
    with pytest.raises(WsymInputError, match="preconditioner"):
        LLQRSAM(model, preconditioner="shampoo", lr=0.1)
    for lr in (0, -0.1):
        with pytest.raises(WsymInputError, match="lr must be a positive number"):
            SAM(model, lr=lr)
    with pytest.raises(WsymInputError, match="beta"):
        LLQRSAM(model, beta=1.0, lr=0.1)
    with pytest.raises(WsymInputError, match="needs a closure"):
        SAM(model, lr=0.1).step()
    with pytest.raises(WsymInputError, match="spec=wsym.detect"):
        GeoSAM(MLP(5, [4], 2).double(), lr=0.1)
    with pytest.raises(WsymInputError, match="takes the model"):
        GeoSAM(list(model.parameters()), lr=0.1)
