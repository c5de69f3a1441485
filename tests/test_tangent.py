"""Flat tangents (views of one buffer, recycled) against plain lists of tensors (float64)."""

import warnings

import pytest
import torch

import wsym
from wsym.models.networks import TinyTransformer
from wsym.sharpness import tangent, worst_case
from wsym.sharpness.perturbation import Geodesic
from wsym.sharpness.tangent import FlatTangent, Pool


def _pair():
    gen = torch.Generator().manual_seed(0)
    shapes = [torch.Size([2, 3]), torch.Size([4]), torch.Size([1, 2, 2])]
    a, b = (torch.randn(14, generator=gen, dtype=torch.float64) for _ in range(2))
    return FlatTangent.of(a, shapes), FlatTangent.of(b, shapes)


def test_flat_operations_equal_the_list_ones():
    a, b = _pair()
    la, lb = [x.clone() for x in a], [x.clone() for x in b]
    for flat, plain in (
        (tangent.add(a, b, -0.3), tangent.add(la, lb, -0.3)),
        (tangent.scale(a, 2.5), tangent.scale(la, 2.5)),
    ):
        assert isinstance(flat, FlatTangent) and not isinstance(plain, FlatTangent)
        assert all(torch.equal(x, y) for x, y in zip(flat, plain, strict=True))
    assert torch.allclose(tangent.dot(a, b), tangent.dot(la, lb), rtol=1e-14, atol=0)
    assert torch.equal(tangent.flat(la), a.flat)


def test_writing_into_a_given_buffer_aliases_nothing_else():
    a, b = _pair()
    expected = a.flat + 0.5 * b.flat
    out = tangent.add(a, b, 0.5, out=a)  # the output may be an input
    assert out is a and torch.equal(a.flat, expected)
    assert a[0].data_ptr() == a.flat.data_ptr()  # the views still see the buffer


def test_pool_recycles_once_and_only_its_own_length():
    pool = Pool(14, torch.zeros(0, dtype=torch.float64))
    a, b = _pair()
    pool.give(a)
    pool.give(a)  # the same buffer twice is kept once
    pool.give(FlatTangent.of(torch.zeros(3, dtype=torch.float64), [torch.Size([3])]))
    pool.give([torch.zeros(14, dtype=torch.float64)])  # not flat: ignored
    assert pool.take() is a.flat
    assert pool.take() is not a.flat  # empty again: a new buffer


class _Plain:
    """A Geodesic seen through plain lists of tensors: no flat buffers, nothing recycled."""

    def __init__(self, geom):
        self.geom, self.names, self.params = geom, geom.names, geom.params

    def zero(self):
        return [x.clone() for x in self.geom.zero()]

    def norm(self, xi):
        return self.geom.norm(xi)

    def linearize(self, xi):
        moved, pullback = self.geom.linearize(xi)
        return moved, lambda grads: [x.clone() for x in pullback(grads)]

    def gradient(self, g):
        return [x.clone() for x in self.geom.gradient(g)]

    def gradient_norm(self, g, d):
        return self.geom.gradient_norm(g, d)

    def spare(self):
        return None

    def release(self, xi):
        pass


@pytest.mark.parametrize("metric", ["mixed", "invariant"])
def test_recycled_flat_ascent_equals_the_plain_one(metric):
    """Recycling buffers must not change one value: a released buffer still read would."""
    torch.manual_seed(0)
    model = TinyTransformer(depth=2).double()
    x, y = torch.randn(16, 10, 4, dtype=torch.float64), torch.randint(0, 10, (16,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = wsym.detect(model, x)
    params = {n: p.detach() for n, p in model.named_parameters()}

    def f(table):
        out = torch.func.functional_call(model, table, (x,))
        return torch.nn.functional.cross_entropy(out, y)

    fast = worst_case(Geodesic(params, spec, metric), f, 0.05, 9)  # steps 9: halvings too
    plain = worst_case(_Plain(Geodesic(params, spec, metric)), f, 0.05, 9)
    assert fast > 0
    assert abs(fast - plain) <= 1e-12 * abs(plain)
