"""Geodesic sharpness modulo the whole detected group, on stock models (float64).

Every test acts with one random element of the *whole* group (all kinds at once,
scales in [1e-2, 1e2]) and compares; Euclidean sharpness is the negative control, and
a move off the orbit must change the value (it is not trivially constant).
"""

import copy

import pytest
import torch
from cases import STOCK, STOCK_HEAVY, _e3nn, stock_case, stock_generator

import wsym
from wsym.errors import SymmetryWarning, WsymInputError
from wsym.group.elements import sample
from wsym.group.generators import continuous_groups
from wsym.models.networks import MLP
from wsym.sharpness import Estimate, sharpness
from wsym.sharpness.gauge import balanced, gauged_groups
from wsym.sharpness.geometry import horizontal
from wsym.sharpness.perturbation import Geodesic

TOL = 1e-6


_case = stock_case
MODELS, HEAVY = STOCK, STOCK_HEAVY
_gen = stock_generator


def _moved(model, spec, seed=3):
    other = copy.deepcopy(model)
    other.load_state_dict(spec.act(spec.sample(seed=seed, scale=(1e-2, 1e2)), model.state_dict()))
    return other


def _value(model, case, measure, average, steps=3):
    _, batches, loss, spec = case
    return sharpness(model, batches, loss, spec=spec, measure=measure, average=average, steps=steps)


PARAMS = [pytest.param(name, marks=pytest.mark.slow) if name in HEAVY else name for name in MODELS]


@pytest.mark.parametrize("name", PARAMS)
@pytest.mark.parametrize("measure", ["geodesic-inv", "geodesic-mix"])
@pytest.mark.parametrize("average", [False, True])
def test_invariant_to_the_whole_group(name, measure, average):
    case = _case(name)
    model, _, _, spec = case
    assert spec.groups, "the model has symmetries to test"
    before = _value(model, case, measure, average)
    after = _value(_moved(model, spec), case, measure, average)
    assert before != 0
    assert abs(after - before) <= TOL * abs(before)


@pytest.mark.parametrize("name", PARAMS)
def test_euclidean_moves_and_geodesic_is_not_constant(name):
    case = _case(name)
    model, _, _, spec = case
    before = _value(model, case, "euclidean", False)
    after = _value(_moved(model, spec), case, "euclidean", False)
    assert abs(after - before) > 1e-3 * abs(before)  # negative control
    off = copy.deepcopy(model)
    with torch.no_grad():  # off the orbit: another function
        for p in off.parameters():
            p.mul_(1 + 0.05 * torch.randn(p.shape, generator=_gen(), dtype=p.dtype))
    a = _value(model, case, "geodesic-mix", False)
    b = _value(off, case, "geodesic-mix", False)
    assert abs(b - a) > 1e-4 * abs(a)


def _geometry(name, metric="mixed"):
    model, _, _, spec = _case(name)
    state = balanced(spec, model.state_dict())
    params = {n: state[n] for n, _ in model.named_parameters()}
    return spec, params, Geodesic(params, spec, metric)


def _random_tangent(geom, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in geom.coordinates()]


@pytest.mark.parametrize("name", ["mlp3", "cnn", "gpt2", "llama", "bert", "e3nn"])
@pytest.mark.parametrize("metric", ["invariant", "mixed"])
def test_projection_is_horizontal_idempotent_orthogonal(name, metric):
    _, _, geom = _geometry(name, metric)
    h = geom.horizontal
    xi = _random_tangent(geom)
    xh = h.project(xi)
    flat = h._flat
    residual = h.adjoint(h.lower(flat(xh)))
    scale = h.adjoint(h.lower(flat([x * k for x, k in zip(xi, h._unflat(h.keep), strict=True)])
                      if h.keep is not None else flat(xi)))  # fmt: skip
    norm = sum(float((r * r).sum()) for r in residual) ** 0.5
    ref = sum(float((r * r).sum()) for r in scale) ** 0.5
    assert norm <= 1e-9 * ref
    again = h.project(xh)
    assert max(float((a - b).abs().max()) for a, b in zip(xh, again, strict=True)) <= 1e-9 * max(
        float(x.abs().max()) for x in xh
    )
    vertical = [a - b for a, b in zip(xi, xh, strict=True)]
    cross = float(geom.inner(vertical, xh))
    assert abs(cross) <= 1e-9 * float(geom.norm(xi)) ** 2


@pytest.mark.parametrize("name", ["mlp3", "gpt2", "llama", "e3nn"])
def test_generators_match_the_group_layer(name):
    """The sparse and block generators equal wsym.group's (which equal jvp of act)."""
    spec, params, geom = _geometry(name)
    h = geom.horizontal
    gens = {g.index: g for g in continuous_groups(spec)}
    gen = torch.Generator().manual_seed(1)
    zero = [torch.zeros(h.n_units), torch.zeros(h.D.shape[1])]
    zero += [torch.zeros((*G.shape[:-2], G.shape[-1], G.shape[-1])) for G, _ in h.stacks]
    zero = [z.double() for z in zero]
    checked = 0
    start = 0
    for i in h.groups:  # scaling groups through their exponents
        n = spec.groups[i].size
        a = torch.randn(n, generator=gen, dtype=torch.float64)
        c = list(zero)
        c[0] = c[0].clone()
        c[0][start : start + n] = a
        start += n
        _compare(geom, h, c, gens[i].apply(params, a))
        checked += 1
    for s, members in enumerate(geom.quotient.members):  # blocks: one coefficient per member
        for k, j in enumerate(members):
            i = geom.quotient.blocks[j][0]
            group = spec.groups[i]
            shape = zero[2 + s].shape[1:]
            a = torch.randn(shape, generator=gen, dtype=torch.float64)
            if group.kind == "orthogonal":
                a = 0.5 * (a - a.mT)
            c = list(zero)
            c[2 + s] = zero[2 + s].clone()
            c[2 + s][k] = a
            coeff = a.reshape(-1) if group.kind == "scaling" else a
            _compare(geom, h, c, gens[i].apply(params, coeff))
            checked += 1
    assert checked


def _compare(geom, h, c, expected):
    flat = geom.from_tangent(h._unflat(h.apply(c)))
    parts = dict(
        zip(geom.names, flat.split([p.numel() for p in geom.params.values()]), strict=True)
    )
    for key, ref in expected.items():
        if key in parts:
            got = parts[key].reshape(ref.shape)
            assert torch.allclose(got, ref, rtol=1e-10, atol=1e-12 * float(ref.abs().max()))


@pytest.mark.parametrize("name", ["mlp3", "cnn", "gpt2", "llama", "bert"])
def test_balanced_point_is_equivariant(name):
    model, _, _, spec = _case(name)
    sd = model.state_dict()
    a = balanced(spec, sd)
    gauged = gauged_groups(spec, {k: a[k] for k, _ in model.named_parameters()})
    b = balanced(spec, spec.act(sample(spec, seed=4, scale=(1e-2, 1e2), groups=gauged), sd))
    matrix = [k for k in ("gl", "orthogonal") if k in spec.kinds()]
    if matrix:  # GL commutes with the balancing: balanced(g x) = g balanced(x)
        g = spec.sample(seed=5, scale=(1e-2, 1e2), kinds=matrix)
        c, d = balanced(spec, spec.act(g, sd)), spec.act(g, a)
        for k, _ in model.named_parameters():
            assert torch.allclose(c[k], d[k], rtol=1e-7, atol=1e-9 * float(d[k].abs().max()))
    if gauged:  # the orbit of the balanced groups has one balanced point
        for k, _ in model.named_parameters():
            assert torch.allclose(a[k], b[k], rtol=1e-7, atol=1e-9 * float(a[k].abs().max()))


@pytest.mark.parametrize("name", ["linear-linear", "mlp1", "diagonal", "e3nn"])
@pytest.mark.parametrize("metric", ["invariant", "mixed"])
def test_without_overlaps_it_is_the_block_geometry(name, metric):
    """No group overlaps another: no balancing, and the projection is the per-block one."""
    spec, params, geom = _plain(name, metric)
    assert not gauged_groups(spec, params)
    xi = _random_tangent(geom, seed=2)
    new = geom.horizontal.project(xi)
    k = len(geom.slots)
    for s, blk in enumerate(geom.blocks):
        old = horizontal(blk, (xi[k + 2 * s], xi[k + 2 * s + 1]), geom.metrics[s], 1e-14)
        for a, b in zip(old, new[k + 2 * s : k + 2 * s + 2], strict=True):
            assert torch.allclose(a, b, rtol=1e-9, atol=1e-9 * float(a.abs().max()))
    assert geom.blocks


def _plain(name, metric):
    torch.manual_seed(0)
    if name == "e3nn":
        model, x = _e3nn().double(), torch.randn(5, 13, dtype=torch.float64)
    elif name == "diagonal":
        model = torch.nn.Sequential(torch.nn.Linear(6, 6, bias=False), torch.nn.ReLU())
        model = torch.nn.Sequential(*model, torch.nn.Linear(6, 1, bias=False)).double()
        x = torch.randn(5, 6, dtype=torch.float64)
    elif name == "linear-linear":  # a full-rank GL(3) pair (more rows than h on both sides)
        model, x = MLP(6, [3], 5, "identity").double(), torch.randn(4, 6, dtype=torch.float64)
    else:
        model, x = MLP(6, [5], 3).double(), torch.randn(4, 6, dtype=torch.float64)
    spec = wsym.detect(model, x)
    params = {n: p.detach() for n, p in model.named_parameters()}
    return spec, params, Geodesic(params, spec, metric)


def test_no_continuous_group_warns_and_equals_adaptive():
    torch.manual_seed(0)
    model, x = MLP(6, [5], 3, "gelu").double(), torch.randn(4, 6, dtype=torch.float64)
    spec = wsym.detect(model, x)
    batches, loss = [(x, torch.randn(4, 3, dtype=torch.float64))], torch.nn.functional.mse_loss
    with pytest.warns(SymmetryWarning, match="no continuous group"):
        a = sharpness(model, batches, loss, spec=spec, measure="geodesic-mix", steps=3)
    assert a == pytest.approx(
        sharpness(model, batches, loss, spec=spec, measure="adaptive", steps=3)
    )


def test_geodesic_differs_from_adaptive_on_a_relu_mlp():
    model, batches, loss, spec = _case("mlp3")
    kw = {"spec": spec, "rho": 0.5, "steps": 6}
    geo = sharpness(model, batches, loss, measure="geodesic-mix", **kw)
    ada = sharpness(model, batches, loss, measure="adaptive", **kw)
    assert abs(geo - ada) > 1e-6 * abs(ada)


def test_nan_weights_name_the_tensor():
    model, batches, loss, spec = _case("mlp3")
    bad = copy.deepcopy(model)
    with torch.no_grad():
        bad[0].weight[0, 0] = float("nan")
    with pytest.raises(WsymInputError, match=r"0\.weight"):
        sharpness(bad, batches, loss, spec=spec, measure="geodesic-mix")


def test_average_case_is_antithetic_with_an_error():
    """A loss linear in the weights has zero average-case sharpness (pairs cancel it)."""
    model = torch.nn.Linear(5, 1).double()
    x = torch.randn(8, 5, dtype=torch.float64)
    batches = [(x, None)]
    value = sharpness(model, batches, lambda out, _: out.mean(), measure="adaptive", average=True)
    assert abs(value) < 1e-15
    model, batches, loss, spec = _case("mlp3")
    est = sharpness(
        model, batches, loss, spec=spec, measure="geodesic-mix", average=True, with_error=True
    )
    assert isinstance(est, Estimate) and est.stderr > 0 and "+-" in str(est)
