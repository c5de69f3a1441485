"""Curvature estimators against dense float64 references on tiny models."""

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call

from wsym.models.networks import MLP, CNN1d, TinyTransformer
from wsym.sharpness.curvature import (
    diagonal_fisher,
    diagonal_hessian,
    fisher_riemannian_sharpness,
    gradient,
    hessian_trace,
    hvp,
    hvp_many,
    kfac_factors,
    kfac_fisher_riemannian_sharpness,
    lambda_max,
    sample_labels,
)
from wsym.sharpness.curvature.hutchinson import split_rows
from wsym.sharpness.curvature.objective import flatten, model_params, unflatten
from wsym.testing.oracles.curvature import dense_fisher, dense_hessian, per_sample_fisher_diagonal

# forward-mode AD loads torch's jvp decompositions through torch.jit.script (torch internal)
pytestmark = [
    pytest.mark.filterwarnings("error"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning"),
]

LOSS = nn.CrossEntropyLoss()


def tiny(activation="tanh", seed=0):
    """A 3-4-2 MLP in float64 and two batches of unequal size (5 and 3)."""
    torch.manual_seed(seed)
    model = MLP(3, [4], 2, activation=activation).double()
    x = torch.randn(8, 3, dtype=torch.float64)
    y = torch.randint(0, 2, (8,))
    return model, [(x[:5], y[:5]), (x[5:], y[5:])]


def flat(d, params):
    return flatten(d, list(params))


@pytest.fixture
def setup():
    model, batches = tiny()
    return model, batches, model_params(model), dense_hessian(model, batches, LOSS)


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_gradient_and_hvp_match_dense(setup, mode):
    model, batches, params, H = setup
    P = H.shape[0]
    g = flat(gradient(model, None, batches, LOSS), params)
    whole = LOSS(model(torch.cat([b[0] for b in batches])), torch.cat([b[1] for b in batches]))
    ref = torch.autograd.grad(whole, list(model.parameters()))
    torch.testing.assert_close(g, torch.cat([r.flatten() for r in ref]), atol=1e-12, rtol=0)
    v = torch.randn(P, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    hv = hvp(model, params, batches, LOSS, unflatten(v, params), mode=mode)
    assert (flat(hv, params) - H @ v).abs().max() < 1e-10
    stack = split_rows(torch.eye(P, dtype=torch.float64)[:5], params)  # e_0 .. e_4
    hvs = hvp_many(model, params, batches, LOSS, stack, chunk_size=2, mode=mode)
    cols = torch.cat([t.reshape(5, -1) for t in hvs.values()], 1)
    assert (cols - H[:, :5].T).abs().max() < 1e-10


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_hutchinson_exact_probes_are_exact(setup, mode):
    model, batches, params, H = setup
    trace = hessian_trace(model, batches, LOSS, probes="exact", mode=mode)
    assert abs(trace - H.trace().item()) < 1e-10
    diag = diagonal_hessian(model, batches, LOSS, probes="exact", chunk_size=7, mode=mode)
    assert (flat(diag, params) - H.diagonal()).abs().max() < 1e-10


def test_hutchinson_trace_converges(setup):
    model, batches, params, H = setup
    probes = 20000
    est = hessian_trace(model, batches, LOSS, probes=probes, chunk_size=5000)
    off = H - torch.diag(H.diagonal())
    sigma = math.sqrt(2 * (off**2).sum().item() / probes)  # std of the Rademacher estimator
    assert abs(est - H.trace().item()) < 4 * sigma
    assert abs(est - H.trace().item()) < 0.03 * abs(H.trace().item())


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_lambda_max_matches_eigvalsh(setup, mode):
    model, batches, _, H = setup
    top = torch.linalg.eigvalsh(H).max().item()
    assert abs(lambda_max(model, batches, LOSS, mode=mode) - top) < 1e-6
    assert abs(lambda_max(model, batches, LOSS, iters=12, mode=mode) - top) < 1e-6


def test_same_seed_same_value(setup):
    model, batches, _, _ = setup
    assert hessian_trace(model, batches, LOSS, 7, seed=3) == hessian_trace(
        model, batches, LOSS, 7, seed=3
    )
    assert hessian_trace(model, batches, LOSS, 7, seed=3) != hessian_trace(
        model, batches, LOSS, 7, seed=4
    )
    assert lambda_max(model, batches, LOSS, iters=5, seed=2) == lambda_max(
        model, batches, LOSS, iters=5, seed=2
    )
    f1, f2 = diagonal_fisher(model, batches, seed=5), diagonal_fisher(model, batches, seed=5)
    assert all(torch.equal(f1[n], f2[n]) for n in f1)
    s = [kfac_fisher_riemannian_sharpness(model, batches, LOSS, probes=4, seed=1) for _ in "ab"]
    assert s[0] == s[1]
    # chunking does not change the probes
    assert hessian_trace(model, batches, LOSS, 9, chunk_size=2) == pytest.approx(
        hessian_trace(model, batches, LOSS, 9, chunk_size=9), abs=1e-12
    )


def test_diagonal_fisher_matches_per_sample_loop(setup):
    model, batches, params, _ = setup
    samples, seed = 3, 11
    gen = torch.Generator().manual_seed(seed)
    labels = [sample_labels(model(x), samples, gen) for x, _ in batches]
    ref = per_sample_fisher_diagonal(model, batches, labels)
    fast = diagonal_fisher(model, batches, samples=samples, seed=seed, chunk_size=2)
    assert (flat(fast, params) - flat(ref, params)).abs().max() < 1e-12


def test_diagonal_fisher_exact_is_dense_fisher_diagonal(setup):
    model, batches, params, _ = setup
    F = dense_fisher(model, batches)
    exact = diagonal_fisher(model, batches, samples="exact")
    assert (flat(exact, params) - F.diagonal()).abs().max() < 1e-12
    many = flat(diagonal_fisher(model, batches, samples=3000), params)
    assert (many - F.diagonal()).abs().max() < 0.1 * F.diagonal().max()


class Rescaled(nn.Module):
    """``base`` reparametrized as theta = D * phi (phi the new parameters)."""

    def __init__(self, base, scales):
        super().__init__()
        self.__dict__["base"] = base  # not a submodule: its parameters are not ours
        self.scales = scales
        self.phi = nn.ParameterDict(
            {
                n.replace(".", "_"): nn.Parameter(p.detach() / scales[n])
                for n, p in base.named_parameters()
            }
        )

    def forward(self, x):
        theta = {n: self.scales[n] * self.phi[n.replace(".", "_")] for n in self.scales}
        return functional_call(self.base, theta, (x,))


def test_diagonal_sharpness_invariant_to_elementwise_rescaling(setup):
    model, batches, params, _ = setup
    gen = torch.Generator().manual_seed(3)
    scales = {
        n: torch.exp(torch.randn(p.shape, generator=gen, dtype=p.dtype)) for n, p in params.items()
    }
    rescaled = Rescaled(model, scales)
    for out in (model, rescaled):
        assert out(batches[0][0]).shape == (5, 2)
    torch.testing.assert_close(rescaled(batches[0][0]), model(batches[0][0]))
    kw = dict(damping=0.0, probes="exact", fisher_samples=3, seed=2)
    s, s_phi = (fisher_riemannian_sharpness(m, batches, LOSS, **kw) for m in (model, rescaled))
    assert abs(s_phi / s - 1) < 1e-6
    # the exact diagonals themselves do change, by D^2
    h = diagonal_hessian(model, batches, LOSS, probes="exact")["0.weight"]
    h_phi = diagonal_hessian(rescaled, batches, LOSS, probes="exact")["phi.0_weight"]
    torch.testing.assert_close(h_phi, h * scales["0.weight"] ** 2)


def test_diagonal_sharpness_invariant_to_relu_rescaling_symmetry():
    model, batches = tiny("leaky_relu")
    kw = dict(damping=0.0, probes="exact", fisher_samples=2)
    before = fisher_riemannian_sharpness(model, batches, LOSS, **kw)
    alpha = torch.tensor([0.3, 2.0, 5.0, 0.7], dtype=torch.float64)
    x = batches[0][0]
    out = model(x)
    with torch.no_grad():
        model[0].weight.mul_(alpha[:, None])
        model[0].bias.mul_(alpha)
        model[2].weight.div_(alpha[None, :])
    torch.testing.assert_close(model(x), out)  # same function, different parameters
    after = fisher_riemannian_sharpness(model, batches, LOSS, **kw)
    assert abs(after / before - 1) < 1e-6


def dense_kfac(model, factors, fisher, params):
    """Block-diagonal (P, P) matrix: K-FAC blocks kron(G, A) for [W | b], diagonal elsewhere."""
    names = list(params)
    offsets, i = {}, 0
    for n in names:
        offsets[n] = i
        i += params[n].numel()
    F = torch.zeros(i, i, dtype=torch.float64)
    for n in fisher:
        idx = torch.arange(offsets[n], offsets[n] + params[n].numel())
        F[idx, idx] = fisher[n].flatten()
    for f in factors.values():
        d_out, d_in = params[f.weight].shape
        rows = torch.arange(d_out)[:, None]
        idx = (offsets[f.weight] + rows * d_in + torch.arange(d_in)[None, :]).tolist()
        if f.bias is not None:
            idx = [r + [offsets[f.bias] + o] for o, r in enumerate(idx)]
        idx = torch.tensor(idx).flatten()  # row-major order of [W | b]
        F[idx[:, None], idx[None, :]] = torch.kron(f.G, f.A)
    return F


def test_kfac_sharpness_exact_probes_match_dense_trace():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3, bias=False)).double()
    model.scale = nn.Parameter(torch.ones(3, dtype=torch.float64))  # a non-Linear parameter
    model.register_forward_hook(lambda mod, inp, out: out * mod.scale)
    x = torch.randn(9, 3, dtype=torch.float64)
    batches = [(x[:6], torch.zeros(6, dtype=torch.long)), (x[6:], torch.ones(3, dtype=torch.long))]
    params = model_params(model)
    factors = kfac_factors(model, batches, samples=2, seed=4)
    assert set(factors) == {"0", "2"} and factors["2"].bias is None
    fisher = diagonal_fisher(model, batches, samples=2, seed=4, params={"scale": params["scale"]})
    damping = 1e-2
    F = dense_kfac(model, factors, fisher, params)
    H = dense_hessian(model, batches, LOSS)
    expected = torch.linalg.solve(F + damping * torch.eye(F.shape[0], dtype=F.dtype), H).trace()
    kw = dict(damping=damping, fisher_samples=2, seed=4)
    got = kfac_fisher_riemannian_sharpness(model, batches, LOSS, probes="exact", **kw)
    assert abs(got - expected.item()) < 1e-9 * abs(expected.item())
    mc = kfac_fisher_riemannian_sharpness(model, batches, LOSS, probes=3000, **kw)
    assert abs(mc - expected.item()) < 0.1 * abs(expected.item())


def test_kfac_block_is_exact_fisher_for_one_sample():
    model, _ = tiny()
    x = torch.randn(1, 3, dtype=torch.float64)
    label = sample_labels(model(x), 1, torch.Generator().manual_seed(6))[0, 0]
    factors = kfac_factors(model, [(x, None)], samples=1, seed=6)

    def nll(p):
        return -functional_call(model, p, (x,))[0].log_softmax(-1)[label]

    g = torch.func.grad(nll)(model_params(model))
    for f in factors.values():
        wbar = torch.cat([g[f.weight], g[f.bias][:, None]], 1).flatten()
        torch.testing.assert_close(torch.kron(f.G, f.A), torch.outer(wbar, wbar))


def test_kfac_inverse_product_is_damped_inverse():
    gen = torch.Generator().manual_seed(0)
    a, g = torch.randn(5, 4, generator=gen).double(), torch.randn(3, 3, generator=gen).double()
    factors = kfac_factors(nn.Linear(3, 3).double(), [(torch.randn(4, 3).double(), None)])[""]
    f = type(factors)("weight", "bias", a @ a.T, g @ g.T)
    V = torch.randn(3, 5, generator=gen).double()
    w, b = f.inverse_product(V[:, :4], V[:, 4], damping=0.1)
    dense = torch.kron(f.G, f.A) + 0.1 * torch.eye(15, dtype=torch.float64)
    ref = torch.linalg.solve(dense, V.flatten()).reshape(3, 5)
    torch.testing.assert_close(torch.cat([w, b[:, None]], 1), ref)


def test_eval_mode_batchnorm_uses_running_stats_and_flag_is_restored():
    torch.manual_seed(0)
    model = CNN1d(channels=2, kernel=3, classes=3).double()
    model.bn1.running_mean.normal_()
    model.bn1.running_var.uniform_(0.5, 2)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    batches = [(x, y)]
    params = model_params(model)
    model.train()
    H = dense_hessian(model, batches, LOSS)
    assert model.training
    v = torch.randn(H.shape[0], dtype=torch.float64)
    hv = hvp(model, None, batches, LOSS, unflatten(v, params))
    assert model.training and model.bn1.training
    assert (flat(hv, params) - H @ v).abs().max() < 1e-10
    # per-sample Fisher is valid because the running statistics make samples independent
    gen = torch.Generator().manual_seed(0)
    model.eval()
    labels = [sample_labels(model(x), 1, gen)]
    model.train()
    ref = per_sample_fisher_diagonal(model, batches, labels)
    fast = diagonal_fisher(model, batches, samples=1, seed=0)
    assert (flat(fast, params) - flat(ref, params)).abs().max() < 1e-12


def test_dropout_is_off():
    model, batches = tiny()
    model = nn.Sequential(model, nn.Dropout(0.5)).train()
    v = {n: torch.ones_like(p) for n, p in model_params(model).items()}
    first, second = (hvp(model, None, batches, LOSS, v) for _ in "ab")
    assert all(torch.equal(first[n], second[n]) for n in v) and model.training


def test_transformer_runs_all_estimators():
    torch.manual_seed(0)
    model = TinyTransformer(dim=8, heads=2, depth=1, hidden=8, classes=3).double()
    x, y = torch.randn(4, 10, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 1])
    batches = [(x, y)]
    factors = kfac_factors(model, batches)
    assert "blocks.0.attn.q" in factors and factors["head"].A.shape == (9, 9)
    values = [
        hessian_trace(model, batches, LOSS, probes=4),
        lambda_max(model, batches, LOSS, iters=5),
        fisher_riemannian_sharpness(model, batches, LOSS, probes=4),
        kfac_fisher_riemannian_sharpness(model, batches, LOSS, probes=4),
    ]
    assert all(math.isfinite(v) for v in values)


def test_hvp_matches_curvlinops(setup):
    curvlinops = pytest.importorskip("curvlinops")
    model, batches, params, _ = setup
    op = curvlinops.HessianLinearOperator(model, LOSS, list(model.parameters()), batches)
    v = torch.randn(sum(p.numel() for p in params.values()), dtype=torch.float64)
    ours = flat(hvp(model, params, batches, LOSS, unflatten(v, params)), params)
    assert (ours - op @ v).abs().max() < 1e-12


@pytest.mark.parametrize("case", ["mlp", "transformer"])
def test_kfac_exact_expectation_matches_curvlinops_type2(case):
    curvlinops = pytest.importorskip("curvlinops")
    torch.manual_seed(0)
    if case == "mlp":
        model, batches = tiny()
    else:
        model = TinyTransformer(dim=8, heads=2, depth=1, hidden=8, classes=3).double()
        x, y = torch.randn(4, 10, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 1])
        batches = [(x[:3], y[:3]), (x[3:], y[3:])]
    ours = kfac_factors(model, batches, samples="exact")
    linear = [
        p for f in ours.values() for n, p in model.named_parameters() if n in (f.weight, f.bias)
    ]
    op = curvlinops.KFACLinearOperator(
        model,
        LOSS,
        linear,
        batches,
        fisher_type="type-2",  # exact expectation over labels, like samples="exact"
        separate_weight_and_bias=False,
        check_deterministic=False,
    )
    op.compute_kronecker_factors()
    for name, f in ours.items():
        torch.testing.assert_close(f.A, op._input_covariances[name], atol=1e-14, rtol=1e-12)
        torch.testing.assert_close(f.G, op._gradient_covariances[name], atol=1e-14, rtol=1e-12)


class SharedAndUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared, self.unused, self.head = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 2)

    def forward(self, x):
        return self.head(self.shared(torch.tanh(self.shared(x))))


def test_kfac_shared_layer_counts_every_call_and_skips_unused():
    torch.manual_seed(0)
    model = SharedAndUnused().double()
    x = torch.randn(6, 3, dtype=torch.float64)
    factors = kfac_factors(model, [(x, None)])
    assert set(factors) == {"shared", "head"}
    a1 = torch.cat([x, torch.ones(6, 1, dtype=x.dtype)], 1)
    h = torch.tanh(model.shared(x)).detach()
    a2 = torch.cat([h, torch.ones(6, 1, dtype=x.dtype)], 1)
    torch.testing.assert_close(factors["shared"].A, (a1.T @ a1 + a2.T @ a2) / 12)
    s = kfac_fisher_riemannian_sharpness(
        model, [(x, torch.zeros(6, dtype=torch.long))], LOSS, probes=3
    )
    assert math.isfinite(s)
