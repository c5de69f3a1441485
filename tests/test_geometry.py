"""Quotient geometry of GL blocks: metrics, horizontal projection, gradients, geodesics.

Every closed form is checked against a slow reference in float64: explicit matrix
formulas, scipy's Sylvester solver and a Kronecker solve, autograd Christoffel
symbols of the metric tensor, and a numerical ODE solve of the geodesic equation.
"""

import math

import pytest
import scipy.linalg
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wsym.sharpness.geometry import (
    METRICS,
    Pair,
    act,
    adaptive_gradient,
    adaptive_inner,
    christoffel,
    conserved,
    geodesic_step,
    horizontal,
    horizontal_lambda,
    inner,
    norm,
    riemannian_gradient,
    vertical,
)
from wsym.testing.oracles.geometry import (
    geodesic_acceleration,
    geodesic_path,
    metric_matrix,
    sylvester_kron,
)

F64 = torch.float64
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INVARIANT_METRICS = ("invariant", "mixed")


# ----------------------------------------------------------------------------- helpers


def gen(seed):
    return torch.Generator().manual_seed(seed)


def rand_factor(g, k, h, batch, spread=2.0):
    """U diag(e^{U(-spread, spread)}) V^T, orthonormal U (k x h) and V: condition < e^{2 spread}."""
    U, _ = torch.linalg.qr(torch.randn(*batch, k, h, generator=g, dtype=F64))
    V, _ = torch.linalg.qr(torch.randn(*batch, h, h, generator=g, dtype=F64))
    s = torch.exp(spread * (2 * torch.rand(*batch, h, generator=g, dtype=F64) - 1))
    return (U * s[..., None, :]) @ V.mT


def rand_block(seed, n=5, m=4, h=3, batch=()):
    g = gen(seed)
    return Pair(rand_factor(g, n, h, batch), rand_factor(g, m, h, batch))


def rand_tangent(block, seed):
    g = gen(seed + 1000)
    return Pair(
        torch.randn(block.G.shape, generator=g, dtype=F64),
        torch.randn(block.H.shape, generator=g, dtype=F64),
    )


def rand_gl(seed, h, batch=()):
    """A random element of GL(h) with condition number below e^2."""
    return rand_factor(gen(seed + 2000), h, h, batch, spread=1.0)


def low_rank(seed, k, r, h):
    g = gen(seed + 3000)
    return torch.randn(k, r, generator=g, dtype=F64) @ torch.randn(r, h, generator=g, dtype=F64)


def euclid(a, b):
    return (a.G * b.G).sum((-2, -1)) + (a.H * b.H).sum((-2, -1))


def scaled(x, c):
    return Pair(c * x.G, c * x.H)


def close(a, b, rtol=1e-10, atol=1e-12):
    torch.testing.assert_close(a.G, b.G, rtol=rtol, atol=atol)
    torch.testing.assert_close(a.H, b.H, rtol=rtol, atol=atol)


def orthogonality_defect(block, xi, metric, eps):
    """max |cos| between xi and the vertical vectors (-G E_ab, H E_ab^T) (nonzero ones)."""
    h = block.G.shape[-1]
    scale = norm(block, block, metric, eps)
    worst = torch.zeros((), dtype=F64)
    for a in range(h):
        for b in range(h):
            E = torch.zeros(h, h, dtype=F64)
            E[a, b] = 1
            v = vertical(block, E.expand(*block.G.shape[:-2], h, h))
            nv = norm(block, v, metric, eps)
            cos = inner(block, xi, v, metric, eps) / (norm(block, xi, metric, eps) * nv)
            cos = torch.where(nv > 1e-12 * scale, cos, torch.zeros_like(cos))
            worst = torch.maximum(worst, cos.abs().max())
    return float(worst)


shapes = st.integers(1, 4).flatmap(
    lambda h: st.tuples(st.just(h), st.integers(h, 6), st.integers(h, 6))
)
batches = st.lists(st.integers(1, 3), max_size=2).map(tuple)
seeds = st.integers(0, 2**20)


# ----------------------------------------------------------------------------- metrics


@pytest.mark.parametrize("metric", METRICS)
def test_inner_matches_explicit_formula_and_metric_tensor(metric):
    block = rand_block(0, batch=(2,))
    eta, zeta = rand_tangent(block, 1), rand_tangent(block, 2)
    G, H = block
    P, Q = G.mT @ G, H.mT @ H
    KG, KH = eta.G.mT @ zeta.G, eta.H.mT @ zeta.H
    tr = lambda M: M.diagonal(dim1=-2, dim2=-1).sum(-1)  # noqa: E731
    expected = {
        "euclidean": tr(KG) + tr(KH),
        "invariant": tr(torch.linalg.inv(P) @ KG) + tr(torch.linalg.inv(Q) @ KH),
        "mixed": tr(Q @ KG) + tr(P @ KH),
    }[metric]
    torch.testing.assert_close(inner(block, eta, zeta, metric, eps=0), expected)
    # tiny default regularization changes nothing visible on a full-rank block
    torch.testing.assert_close(inner(block, eta, zeta, metric), expected, rtol=1e-8, atol=0)
    # dense metric tensor of the reference, on the first block of the batch
    one = Pair(G[0], H[0])
    g = metric_matrix(one, metric)
    vec = lambda x: torch.cat([x.G[0].reshape(-1), x.H[0].reshape(-1)])  # noqa: E731
    torch.testing.assert_close(vec(eta) @ g @ vec(zeta), expected[0])
    assert torch.linalg.eigvalsh(g).min() > 0


def test_metric_rejects_unknown_name_and_bad_shapes():
    block = rand_block(0)
    with pytest.raises(ValueError, match="unknown metric"):
        inner(block, block, block, "fisher")
    with pytest.raises(ValueError, match="expected G"):
        horizontal((block.G, block.H[:, :2]), block)


@SETTINGS
@given(shape=shapes, batch=batches, seed=seeds, metric=st.sampled_from(INVARIANT_METRICS))
def test_metric_invariant_under_gl(shape, batch, seed, metric):
    h, n, m = shape
    block = rand_block(seed, n, m, h, batch)
    eta, zeta, A = rand_tangent(block, seed), rand_tangent(block, seed + 1), rand_gl(seed, h, batch)
    before = inner(block, eta, zeta, metric, eps=0)
    after = inner(act(block, A), act(eta, A), act(zeta, A), metric, eps=0)
    scale = norm(block, eta, metric, eps=0) * norm(block, zeta, metric, eps=0)
    assert ((before - after).abs() <= 1e-9 * scale).all()
    # default eps: invariant up to O(eps)
    after_eps = inner(act(block, A), act(eta, A), act(zeta, A), metric)
    assert ((before - after_eps).abs() <= 1e-6 * scale).all()


def test_euclidean_metric_is_not_invariant():
    block = rand_block(1)
    xi, A = rand_tangent(block, 1), rand_gl(1, 3)
    a = inner(block, xi, xi, "euclidean")
    b = inner(act(block, A), act(xi, A), act(xi, A), "euclidean")
    assert abs(float(a - b)) > 1e-3 * float(a)


def test_adaptive_metric_and_gradient():
    g = gen(5)
    w, eta, zeta = (torch.randn(7, 3, generator=g, dtype=F64) for _ in range(3))
    torch.testing.assert_close(adaptive_inner(w, eta, zeta, eps=0), (eta * zeta / w**2).sum())
    alpha = torch.exp(torch.randn(7, 3, generator=g, dtype=F64)) * torch.sign(torch.randn(7, 3))
    torch.testing.assert_close(
        adaptive_inner(alpha * w, alpha * eta, alpha * zeta, eps=0),
        adaptive_inner(w, eta, zeta, eps=0),
    )
    grad = torch.randn(7, 3, generator=g, dtype=F64)
    r = adaptive_gradient(w, grad)
    torch.testing.assert_close(adaptive_inner(w, r, zeta), (grad * zeta).sum())
    assert torch.isfinite(adaptive_inner(torch.zeros(3), torch.ones(3), torch.ones(3)))


# ----------------------------------------------------------------------------- horizontal


def test_invariant_sylvester_equation_as_derived():
    """X = Lambda^T solves A X + X A = B (docs/geometry.md), not the paper's A L + L A^T = B."""
    block = rand_block(3, batch=(4,))
    xi = rand_tangent(block, 3)
    G, H = block
    A = G.mT @ G @ H.mT @ H
    B = G.mT @ G @ H.mT @ xi.H - xi.G.mT @ G @ H.mT @ H
    X = horizontal_lambda(block, xi, "invariant", eps=0).mT
    torch.testing.assert_close(A @ X + X @ A, B, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(X, sylvester_kron(A, A, B), rtol=1e-9, atol=1e-11)
    for i in range(4):
        ref = scipy.linalg.solve_sylvester(A[i].numpy(), A[i].numpy(), B[i].numpy())
        torch.testing.assert_close(X[i], torch.from_numpy(ref), rtol=1e-9, atol=1e-11)
    # the form printed in the paper gives a vector that is not horizontal
    lam_paper = sylvester_kron(A, A.mT, B)
    paper = Pair(xi.G + G @ lam_paper, xi.H - H @ lam_paper.mT)
    assert orthogonality_defect(block, paper, "invariant", 0) > 1e-3
    assert (
        orthogonality_defect(block, horizontal(block, xi, "invariant", 0), "invariant", 0) < 1e-12
    )


def test_mixed_closed_form_as_derived():
    block = rand_block(4, batch=(3,))
    xi = rand_tangent(block, 4)
    G, H = block
    inv = torch.linalg.inv
    closed = 0.5 * (xi.H.mT @ H @ inv(H.mT @ H) - inv(G.mT @ G) @ G.mT @ xi.G)
    torch.testing.assert_close(horizontal_lambda(block, xi, "mixed", eps=0), closed)


def test_euclidean_lambda_solves_its_sylvester_equation():
    block = rand_block(5, batch=(2,))
    xi = rand_tangent(block, 5)
    G, H = block
    lam = horizontal_lambda(block, xi, "euclidean")
    rhs = xi.H.mT @ H - G.mT @ xi.G
    torch.testing.assert_close(G.mT @ G @ lam + lam @ H.mT @ H, rhs)


@SETTINGS
@given(
    shape=shapes,
    batch=batches,
    seed=seeds,
    metric=st.sampled_from(METRICS),
    eps=st.sampled_from([0.0, 1e-10]),
)
def test_horizontal_is_the_orthogonal_projection(shape, batch, seed, metric, eps):
    h, n, m = shape
    block = rand_block(seed, n, m, h, batch)
    xi = rand_tangent(block, seed)
    hor = horizontal(block, xi, metric, eps)
    assert orthogonality_defect(block, hor, metric, eps) < 1e-10
    close(horizontal(block, hor, metric, eps), hor, rtol=1e-8, atol=1e-10)  # idempotent
    omega = torch.randn(*batch, h, h, generator=gen(seed), dtype=F64)
    v = vertical(block, omega)
    residual = horizontal(block, v, metric, eps)  # vertical vectors project to zero
    assert (norm(block, residual, metric, eps) <= 1e-8 * norm(block, v, metric, eps)).all()
    # Pythagoras: xi = hor + vertical
    vert = Pair(xi.G - hor.G, xi.H - hor.H)
    total = norm(block, hor, metric, eps) ** 2 + norm(block, vert, metric, eps) ** 2
    torch.testing.assert_close(total, norm(block, xi, metric, eps) ** 2, rtol=1e-8, atol=0)


@SETTINGS
@given(shape=shapes, batch=batches, seed=seeds, metric=st.sampled_from(INVARIANT_METRICS))
def test_horizontal_is_equivariant(shape, batch, seed, metric):
    h, n, m = shape
    block = rand_block(seed, n, m, h, batch)
    xi, A = rand_tangent(block, seed), rand_gl(seed, h, batch)
    moved = horizontal(act(block, A), act(xi, A), metric, eps=0)
    close(moved, act(horizontal(block, xi, metric, eps=0), A), rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("singular", ["G", "both"])
def test_rank_deficient_blocks_stay_finite_and_exact(metric, singular):
    n, m, h = 5, 4, 3
    G = low_rank(0, n, h - 1, h)
    H = low_rank(1, m, h - 1, h) if singular == "both" else torch.randn(m, h, dtype=F64)
    block, xi = Pair(G, H), rand_tangent(Pair(G, H), 7)
    results = [
        inner(block, xi, xi, metric),
        *horizontal(block, xi, metric),
        *riemannian_gradient(block, xi, metric),
        *geodesic_step(block, scaled(xi, 0.01), metric),
    ]
    assert all(torch.isfinite(r).all() for r in results)
    assert orthogonality_defect(block, horizontal(block, xi, metric), metric, 1e-10) < 1e-9
    # does not depend on eps once it is small
    close(horizontal(block, xi, metric, 1e-8), horizontal(block, xi, metric, 1e-10), 1e-4, 1e-4)


# ----------------------------------------------------------------------------- gradient


def quadratic_loss(block, T):
    return ((block.G @ block.H.mT - T) ** 2).sum()


def euclidean_grad(loss, block):
    G = block.G.clone().requires_grad_()
    H = block.H.clone().requires_grad_()
    return Pair(*torch.autograd.grad(loss(Pair(G, H)), (G, H)))


@pytest.mark.parametrize("metric", METRICS)
def test_riemannian_gradient_represents_the_differential(metric):
    block = rand_block(8, batch=(2,))
    T = torch.randn(2, 5, 4, generator=gen(8), dtype=F64)
    grad = euclidean_grad(lambda b: quadratic_loss(b, T), block)
    r = riemannian_gradient(block, grad, metric)
    for seed in range(3):
        xi = rand_tangent(block, seed)
        torch.testing.assert_close(inner(block, r, xi, metric), euclid(grad, xi))
    # for a loss of G H^T the projection changes nothing
    close(r, riemannian_gradient(block, grad, metric, project=False), rtol=1e-9, atol=1e-10)
    # a non-invariant loss: unprojected for every xi, projected for horizontal xi
    grad = euclidean_grad(lambda b: quadratic_loss(b, T) + (b.G**4).sum(), block)
    raw = riemannian_gradient(block, grad, metric, project=False)
    hor = riemannian_gradient(block, grad, metric)
    xi = rand_tangent(block, 9)
    torch.testing.assert_close(inner(block, raw, xi, metric), euclid(grad, xi))
    xi = horizontal(block, xi, metric)
    torch.testing.assert_close(inner(block, hor, xi, metric), euclid(grad, xi))


# ----------------------------------------------------------------------------- geodesics


@pytest.mark.parametrize("metric", METRICS)
def test_christoffel_matches_autograd_of_the_metric(metric):
    block = rand_block(10, n=3, m=4, h=2)
    for seed in range(2):
        xi = rand_tangent(block, seed)
        acc = geodesic_acceleration(block, xi, metric)
        close(christoffel(block, xi, metric, eps=0), scaled(acc, -1.0), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("metric", INVARIANT_METRICS)
def test_geodesic_step_is_third_order_against_ode(metric):
    block = rand_block(11, n=3, m=2, h=2)
    block = Pair(block.G, block.H + torch.eye(2, dtype=F64))
    xi = horizontal(block, rand_tangent(block, 11), metric, eps=0)
    xi = scaled(xi, 1 / math.sqrt(float(euclid(xi, xi))))
    s = [0.1, 0.05, 0.025]
    exact = geodesic_path(block, xi, metric, s)  # gamma_{s xi}(1) = gamma_xi(s)
    err2, err3 = [], []
    for si, ref in zip(s, exact, strict=True):
        step = geodesic_step(block, scaled(xi, si), metric, eps=0)
        first = Pair(block.G + si * xi.G, block.H + si * xi.H)
        err3.append(math.sqrt(float(euclid(diff := Pair(step.G - ref.G, step.H - ref.H), diff))))
        err2.append(math.sqrt(float(euclid(diff := Pair(first.G - ref.G, first.H - ref.H), diff))))
    assert 7.0 < err3[-2] / err3[-1] < 9.0, err3  # O(|xi|^3) with the Christoffel term
    assert 3.5 < err2[-2] / err2[-1] < 4.5, err2  # O(|xi|^2) without it
    assert err3[-1] < 0.1 * err2[-1]


@SETTINGS
@given(shape=shapes, batch=batches, seed=seeds, metric=st.sampled_from(INVARIANT_METRICS))
def test_geodesic_step_commutes_with_the_action(shape, batch, seed, metric):
    h, n, m = shape
    block = rand_block(seed, n, m, h, batch)
    xi, A = scaled(rand_tangent(block, seed), 0.1), rand_gl(seed, h, batch)
    moved = geodesic_step(act(block, A), act(xi, A), metric, eps=0)
    close(moved, act(geodesic_step(block, xi, metric, eps=0), A), rtol=1e-7, atol=1e-9)


def test_euclidean_geodesic_is_a_straight_line():
    block = rand_block(12)
    xi = rand_tangent(block, 12)
    close(geodesic_step(block, xi, "euclidean"), Pair(block.G + xi.G, block.H + xi.H))


# ----------------------------------------------------------------------------- diagonal nets


def diagonal(d=6, seed=13):
    """A diagonal linear network y = x^T (u * v) as d independent 1 x 1 GL blocks."""
    g = gen(seed)
    u = torch.randn(d, generator=g, dtype=F64)
    v = torch.randn(d, generator=g, dtype=F64)
    return u, v, Pair(u[:, None, None], v[:, None, None])


def test_diagonal_network_metrics_and_horizontal_space():
    u, v, block = diagonal()
    eu, ev = torch.randn(6, dtype=F64), torch.randn(6, dtype=F64)
    nu, nv = torch.randn(6, dtype=F64), torch.randn(6, dtype=F64)
    eta, nu_ = (
        Pair(eu[:, None, None], ev[:, None, None]),
        Pair(nu[:, None, None], nv[:, None, None]),
    )
    inv = (eu * nu / u**2 + ev * nv / v**2).sum()
    mix = (eu * nu * v**2 + ev * nv * u**2).sum()
    torch.testing.assert_close(inner(block, eta, nu_, "invariant", eps=0).sum(), inv)
    torch.testing.assert_close(inner(block, eta, nu_, "mixed", eps=0).sum(), mix)
    for metric in INVARIANT_METRICS:
        hor = horizontal(block, eta, metric)
        b_u, b_v = hor.G.flatten() / u, hor.H.flatten() / v
        torch.testing.assert_close(b_u, b_v)  # eta_u / u = eta_v / v
        torch.testing.assert_close(b_u, (eu / u + ev / v) / 2)


@pytest.mark.parametrize("metric", INVARIANT_METRICS)
def test_diagonal_network_geodesics(metric):
    u, v, block = diagonal(d=3)
    b = torch.tensor([0.3, -0.2, 0.1], dtype=F64)
    xi = Pair((b * u)[:, None, None], (b * v)[:, None, None])

    def exact(t):
        f = torch.exp(b * t) if metric == "invariant" else torch.sqrt(1 + 2 * b * t)
        return u * f, v * f

    # the step is the exact second-order Taylor polynomial of the closed form
    c2 = 0.5 if metric == "invariant" else -0.5
    step = geodesic_step(block, xi, metric, eps=0)
    torch.testing.assert_close(step.G.flatten(), u * (1 + b + c2 * b**2))
    torch.testing.assert_close(step.H.flatten(), v * (1 + b + c2 * b**2))
    # the autograd ODE reference reproduces the closed form, one 1 x 1 block at a time
    for i in range(3):
        ref = geodesic_path(Pair(block.G[i], block.H[i]), Pair(xi.G[i], xi.H[i]), metric)[0]
        torch.testing.assert_close(ref.G.flatten(), exact(1.0)[0][i : i + 1], rtol=1e-9, atol=0)
        torch.testing.assert_close(ref.H.flatten(), exact(1.0)[1][i : i + 1], rtol=1e-9, atol=0)
    errors = []
    for s in (0.1, 0.05):
        step = geodesic_step(block, scaled(xi, s), metric, eps=0)
        errors.append(float((step.G.flatten() - exact(s)[0]).norm()))
    assert 7.0 < errors[0] / errors[1] < 9.0


# ----------------------------------------------------------------------------- conserved


def gd(block, T, lr, steps, wd=0.0):
    history = [conserved(block)]
    for _ in range(steps):
        grad = euclidean_grad(lambda b: quadratic_loss(b, T), block)
        block = Pair(block.G - lr * (grad.G + wd * block.G), block.H - lr * (grad.H + wd * block.H))
        history.append(conserved(block))
    return block, history


def test_conserved_drifts_at_order_lr_squared():
    block = scaled(rand_block(14, batch=(2,)), 0.5)
    T = torch.randn(2, 5, 4, generator=gen(14), dtype=F64)
    assert conserved(block).shape == (2, 3, 3)
    grad = euclidean_grad(lambda b: quadratic_loss(b, T), block)
    lr = 1e-3
    _, hist = gd(block, T, lr, 1)
    torch.testing.assert_close(hist[1] - hist[0], lr**2 * (grad.G.mT @ grad.G - grad.H.mT @ grad.H))
    drifts = [(gd(block, T, lr, 20)[1][-1] - hist[0]).norm() for lr in (2e-4, 1e-4)]
    assert 3.5 < float(drifts[0] / drifts[1]) < 4.5


def test_conserved_decays_geometrically_under_weight_decay():
    block = scaled(rand_block(15), 0.5)
    T = torch.randn(5, 4, generator=gen(15), dtype=F64)
    lr, wd, steps = 1e-3, 5.0, 500
    _, hist = gd(block, T, lr, steps, wd)
    predicted = (1 - lr * wd) ** (2 * steps) * hist[0]
    assert float(hist[-1].norm()) < 0.05 * float(hist[0].norm())
    assert float((hist[-1] - predicted).norm()) < 0.02 * float(hist[0].norm())
