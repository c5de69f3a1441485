"""Closed-form pullbacks of the geodesic ascent against autograd (float64)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import wsym
from wsym.models.networks import TinyTransformer
from wsym.sharpness import quotient, worst_case
from wsym.sharpness.geometry import Pair, geodesic_step, geodesic_step_vjp
from wsym.sharpness.perturbation import Geodesic


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    metric=st.sampled_from(["invariant", "mixed", "euclidean"]),
    eps=st.sampled_from([0.0, 1e-6, 1e-2]),
    dims=st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(1, 6), st.integers(1, 4)),
)
def test_vjp_matches_autograd(seed, metric, eps, dims):
    lead, n, m, h = dims
    n, m = n + h, m + h  # full column rank, so eps = 0 is finite
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    G, H = rand(lead, n, h) + 0.1, rand(lead, m, h) + 0.1
    xi = (rand(lead, n, h).requires_grad_(), rand(lead, m, h).requires_grad_())
    g = (rand(lead, n, h), rand(lead, m, h))
    auto = torch.autograd.grad(
        geodesic_step((G, H), xi, metric, eps), xi, grad_outputs=g, allow_unused=True
    )
    auto = [gi if a is None else a for a, gi in zip(auto, g, strict=True)]  # euclidean: identity
    closed = geodesic_step_vjp((G, H), [x.detach() for x in xi], g, metric, eps)
    for a, b in zip(auto, closed, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-7)


@pytest.fixture(scope="module")
def transformer():
    torch.manual_seed(0)
    model = TinyTransformer().double()
    x, y = torch.randn(16, 10, 4, dtype=torch.float64), torch.randint(0, 10, (16,))
    spec = wsym.detect(model, x)
    params = {n: p.detach() for n, p in model.named_parameters()}
    return model, x, y, spec, params


def test_gather_is_adjoint_of_scatter(transformer):
    _, _, _, spec, params = transformer
    q = quotient.Quotient(spec, params)
    gen = torch.Generator().manual_seed(1)
    t = [
        Pair(*(torch.randn(M.shape, generator=gen, dtype=M.dtype) for M in b)) for _, b in q.blocks
    ]
    p = {n: torch.randn(v.shape, generator=gen, dtype=v.dtype) for n, v in params.items()}
    lhs = sum((q.scatter(t)[n] * p[n]).sum() for n in params)
    rhs = sum(
        (a * b).sum()
        for ta, tb in zip(t, q.gather(p), strict=True)
        for a, b in zip(ta, tb, strict=True)
    )
    torch.testing.assert_close(lhs, rhs)
    back = q.gather(params)
    for (_, b), r in zip(q.blocks, back, strict=True):
        assert torch.equal(b.G, r.G) and torch.equal(b.H, r.H)


class _AutogradStep(Geodesic):
    """The same second-order step, differentiated by autograd (overriding ``move``)."""

    def move(self, block, xi, s=0):
        return super().move(block, xi, s)


@pytest.mark.parametrize("metric", ["invariant", "mixed"])
def test_closed_pullback_ascent_equals_autograd(transformer, metric):
    model, x, y, spec, params = transformer

    def f(p):
        return torch.nn.functional.cross_entropy(torch.func.functional_call(model, p, (x,)), y)

    fast = worst_case(Geodesic(params, spec, metric), f, 0.05, 5)
    slow = worst_case(_AutogradStep(params, spec, metric), f, 0.05, 5)
    assert fast > 0
    assert fast == pytest.approx(slow, rel=1e-9)
