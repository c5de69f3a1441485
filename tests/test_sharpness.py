"""wsym.sharpness and wsym.sharpness.quotient: invariance under the claimed groups, in float64."""

import copy
import warnings

import pytest
import torch

from wsym.errors import SymmetryWarning, WsymInputError
from wsym.group import units
from wsym.group.elements import sample
from wsym.sharpness import quotient, sharpness

RATIO = 1e-3


def _regression(model, inputs, n_out, seed=1, n=2):
    gen = torch.Generator().manual_seed(seed)
    shape = (4, *inputs.shape[1:])
    return [
        (torch.randn(shape, generator=gen), torch.randn(4, n_out, generator=gen)) for _ in range(n)
    ]


def _mse(out, y):
    return ((out - y) ** 2).mean()


def _ce(out, y):
    return torch.nn.functional.cross_entropy(out, y)


def _moved(model, spec, element):
    sd = {k: v.double() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    other = copy.deepcopy(model).double()
    other.load_state_dict(spec.act(element, sd))
    return other


def _moves(model, spec, element, at_least=1e-3):
    """Whether ``element`` changes some weight by more than ``at_least`` relative."""
    sd = {k: v.double() for k, v in model.state_dict().items() if v.is_floating_point()}
    moved = spec.act(element, sd)
    return any(
        float((moved[k] - v).abs().max()) > at_least * float(v.abs().max()) for k, v in sd.items()
    )


def _safe_groups(spec, kinds):
    """Groups of ``kinds``; scaling groups that rescale rows of a GL block are left out."""
    gl_params = {p for g in spec.groups if g.kind == "gl" for p in g.params}
    return [
        i
        for i, g in enumerate(spec.groups)
        if g.kind in kinds and not (g.kind == "scaling" and set(g.params) & gl_params)
    ]


def _transformer(detected):
    model, _, spec = detected("tiny-transformer")
    gen = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(4, 6, 4, generator=gen), torch.randint(0, 3, (4,), generator=gen))
        for _ in range(2)
    ]
    return model, spec, batches, _ce


def _bert(detected):
    model, _, spec = detected("bert")
    gen = torch.Generator().manual_seed(1)
    batches = [
        (
            {"input_ids": torch.randint(0, 100, (2, 7), generator=gen)},
            torch.randn(2, 3, generator=gen),
        )
    ]

    def loss(out, y):
        return ((out.last_hidden_state[:, 0, :3] - y) ** 2).mean()

    return model, spec, batches, loss


def _mlp(detected):
    model, inputs, spec = detected("mlp-relu")
    return model, spec, _regression(model, inputs, 3), _mse


SETUPS = {"mlp-relu": _mlp, "tiny-transformer": _transformer, "bert": _bert}


@pytest.mark.parametrize("name", ["tiny-transformer", "bert"])
def test_quotient_round_trip(detected, name):
    model, _, spec = detected(name)
    params = {n: p.detach().double() for n, p in model.named_parameters()}
    q = quotient.Quotient(spec, params)
    assert q.blocks
    for i, block in q.blocks:
        if spec.groups[i].kind != "gl":  # GL(1) scaling blocks: see test_scaling_is_gl1_block
            continue
        ref = units.block_matrices(spec, params, spec.groups[i])
        assert torch.equal(ref[0], block.G) and torch.equal(ref[1], block.H)
    back = q.scatter([b for _, b in q.blocks])
    for n, p in params.items():
        mask = q.covered[n]
        assert torch.equal(back[n][mask], p[mask])
        assert torch.equal(back[n][~mask], torch.zeros_like(p[~mask]))


CLAIMS = [
    ("mlp-relu", "adaptive", ["scaling", "permutation"]),
    ("tiny-transformer", "adaptive", ["scaling", "sign", "permutation"]),
    ("tiny-transformer", "geodesic-inv", ["gl", "scaling", "sign", "permutation"]),
    ("tiny-transformer", "geodesic-mix", ["gl", "scaling", "sign", "permutation"]),
    ("bert", "geodesic-mix", ["gl", "permutation"]),
]


@pytest.mark.parametrize(("name", "measure", "kinds"), CLAIMS)
def test_worst_case_invariant(detected, name, measure, kinds):
    model, spec, batches, loss = SETUPS[name](detected)
    groups = _safe_groups(spec, kinds) if measure.startswith("geodesic") else None
    element = sample(spec, seed=3, kinds=kinds if groups is None else None, groups=groups)
    a = sharpness(model, batches, loss, spec=spec, measure=measure, steps=6)
    b = sharpness(_moved(model, spec, element), batches, loss, spec=spec, measure=measure, steps=6)
    assert a > 0
    assert _moves(model, spec, element), "the element must move the weights"
    assert abs(a - b) <= RATIO * abs(a)


AVERAGE_CLAIMS = [
    ("mlp-relu", "adaptive", ["scaling"]),
    ("tiny-transformer", "adaptive", ["scaling", "sign"]),
    ("tiny-transformer", "geodesic-inv", ["gl", "scaling"]),
    ("tiny-transformer", "geodesic-mix", ["gl", "scaling"]),
]


@pytest.mark.parametrize(("name", "measure", "kinds"), AVERAGE_CLAIMS)
def test_average_case_invariant(detected, name, measure, kinds):
    """Same seed: exact for continuous groups (directions drawn in metric coordinates)."""
    model, spec, batches, loss = SETUPS[name](detected)
    groups = _safe_groups(spec, kinds)
    element = sample(spec, seed=3, groups=groups)
    kw = {"spec": spec, "measure": measure, "average": True, "rho": 1.0}
    a = sharpness(model, batches, loss, **kw)
    b = sharpness(_moved(model, spec, element), batches, loss, **kw)
    assert a != 0, "the average must not be trivially zero"
    assert _moves(model, spec, element), "the element must move the weights"
    assert abs(a - b) <= RATIO * abs(a)


@pytest.mark.parametrize(
    ("name", "kinds"), [("mlp-relu", ["scaling"]), ("tiny-transformer", ["gl"])]
)
def test_euclidean_is_not_invariant(detected, name, kinds):
    model, spec, batches, loss = SETUPS[name](detected)
    moved = _moved(model, spec, spec.sample(3, kinds=kinds))
    a = sharpness(model, batches, loss, spec=spec, measure="euclidean", steps=6)
    b = sharpness(moved, batches, loss, spec=spec, measure="euclidean", steps=6)
    assert abs(a - b) > RATIO * abs(a)


@pytest.mark.parametrize("average", [False, True])
def test_same_seed_same_value(detected, average):
    model, spec, batches, loss = _transformer(detected)
    kw = {"spec": spec, "measure": "geodesic-mix", "average": average, "steps": 4}
    a = sharpness(model, batches, loss, seed=5, **kw)
    assert a == sharpness(model, batches, loss, seed=5, **kw)
    if average:
        assert a != sharpness(model, batches, loss, seed=6, **kw)


def test_detects_spec_when_none(detected):
    model, spec, batches, loss = _transformer(detected)
    a = sharpness(model, batches, loss, measure="geodesic-inv", steps=3)
    assert a == sharpness(model, batches, loss, spec=spec, measure="geodesic-inv", steps=3)


@pytest.mark.parametrize(
    "kwargs", [{"rho": 0.0}, {"rho": -1.0}, {"measure": "sam"}, {"steps": 0}, {"bogus": 1}]
)
def test_bad_input(detected, kwargs):
    model, spec, batches, loss = _mlp(detected)
    kwargs = {"measure": "adaptive", **kwargs}
    with pytest.raises(WsymInputError) as info:
        sharpness(model, batches, loss, spec=spec, **kwargs)
    assert "\n" not in str(info.value)


def test_singular_block_is_finite(detected):
    model, spec, batches, loss = _transformer(detected)
    model = copy.deepcopy(model)
    with torch.no_grad():  # head 0's query features and head 1's keys: rank-deficient blocks
        model.blocks[0].attn.q.weight[:4] = 0
        model.blocks[0].attn.q.bias[:4] = 0
        model.blocks[0].attn.k.weight[4:] = 0
    adaptive = sharpness(model, batches, loss, spec=spec, measure="adaptive")
    for measure in ("geodesic-inv", "geodesic-mix"):
        worst = sharpness(model, batches, loss, spec=spec, measure=measure)
        assert 0 < worst < 10 * adaptive  # finite, and of the adaptive measure's order
        # the average over random directions: below the worst case (it may be negative)
        assert (
            abs(sharpness(model, batches, loss, spec=spec, measure=measure, average=True)) < worst
        )


def test_block_with_fewer_rows_than_its_size_is_left_out():
    """Linear(8, 4) -> Linear(4, 2): GL(4) whose second factor has 2 rows (a singular Gram).

    The mixed metric weighs the first factor by that Gram matrix; kept as a block,
    the ascent ran to ~1e16. Left out of the quotient, with a warning.
    """
    import wsym

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4), torch.nn.Linear(4, 2)
    ).double()
    x, y = torch.randn(32, 6, dtype=torch.float64), torch.randint(0, 2, (32,))
    spec = wsym.detect(model, (x[:8],))
    assert "gl" in {g.kind for g in spec.groups}
    adaptive = sharpness(model, [(x, y)], _ce, spec=spec, measure="adaptive", steps=4)
    for measure in ("geodesic-inv", "geodesic-mix"):
        with pytest.warns(SymmetryWarning, match="fewer rows than its size"):
            value = sharpness(model, [(x, y)], _ce, spec=spec, measure=measure, steps=4)
        assert 0 < value < 10 * adaptive


def test_relu_scalings_form_the_quotient(detected):
    """No GL block: the ReLU scalings are the quotient, no warning, no fallback."""
    model, spec, batches, loss = _mlp(detected)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SymmetryWarning)
        geo = sharpness(model, batches, loss, spec=spec, measure="geodesic-mix", steps=4)
    assert geo > 0 and torch.isfinite(torch.tensor(geo))


def test_curvature_measures(detected):
    model, _, spec = detected("mlp-relu")
    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 6, generator=gen)
    y = torch.randint(0, 3, (32,), generator=gen)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):  # trained-ish
        opt.zero_grad()
        _ce(model(x), y).backward()
        opt.step()
    batches = [(x[:16], y[:16]), (x[16:], y[16:])]
    trace = sharpness(model, batches, _ce, spec=spec, measure="hessian-trace", probes="exact")
    top = sharpness(model, batches, _ce, spec=spec, measure="lambda-max")
    fisher = sharpness(
        model, batches, _ce, spec=spec, measure="fisher", probes="exact", fisher_samples="exact"
    )
    assert trace > 0 and top > 0 and trace >= top - 1e-8
    assert fisher == pytest.approx(_relative_fisher_reference(model, x, y, spec), rel=1e-6)


def _relative_fisher_reference(model, x, y, spec, damping=1e-3):
    """sum_i t_i^2 H_ii / (t_i^2 F_ii + damping) at the canonical point, from dense float64."""
    from torch.func import functional_call

    from wsym.sharpness.curvature.fisher_riemannian import canonical_point

    model = copy.deepcopy(model).double().eval()
    params = {n: p.detach() for n, p in model.named_parameters()}
    model, params = canonical_point(model, params, spec)
    names, shapes = list(params), [p.shape for p in params.values()]
    flat = torch.cat([p.reshape(-1) for p in params.values()])
    x = x.double()

    def unflatten(v):
        parts = v.split([s.numel() for s in shapes])
        return {n: t.reshape(s) for n, t, s in zip(names, parts, shapes, strict=True)}

    def log_probs(v, inputs):
        return functional_call(model, unflatten(v), (inputs,)).log_softmax(-1)

    hess = torch.autograd.functional.hessian(lambda v: _ce(log_probs(v, x), y), flat).diagonal()
    fisher = torch.zeros_like(flat)
    for row in x.split(1):  # exact expectation over the model's own labels
        jac = torch.autograd.functional.jacobian(lambda v, row=row: log_probs(v, row)[0], flat)
        probs = log_probs(flat, row)[0].exp()
        fisher += (probs[:, None] * jac**2).sum(0) / len(x)
    sq = flat**2
    return float((sq * hess / (sq * fisher + damping)).sum())


@pytest.mark.parametrize("name", ["mlp-relu", "residual-cnn"])
def test_fisher_invariant_to_elementwise_groups(detected, name):
    model, inputs, spec = detected(name)
    model = copy.deepcopy(model).double()
    with torch.no_grad():  # zero weights (fresh biases) are fixed points the probes cannot scale
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    x = inputs.double() if torch.is_tensor(inputs) else inputs
    y = torch.randint(
        0, model(x).shape[-1], (x.shape[0],), generator=torch.Generator().manual_seed(0)
    )
    sd = {k: v.double() for k, v in model.state_dict().items()}
    g = spec.sample(seed=2, scale=(1e-2, 1e2), kinds=["scaling", "sign", "norm_scaling"])
    moved = copy.deepcopy(model)
    moved.load_state_dict(spec.act(g, sd))
    values = [
        sharpness(m, [(x, y)], _ce, spec=spec, measure="fisher", probes=8) for m in (model, moved)
    ]
    from wsym.sharpness.curvature import fisher_riemannian_sharpness

    plain = [  # at the point itself, not the canonical one: no invariance from the orbit
        fisher_riemannian_sharpness(m, [(x, y)], _ce, probes=8, relative=False)
        for m in (model, moved)
    ]
    assert values[1] == pytest.approx(values[0], rel=1e-6)
    assert abs(plain[1] / plain[0] - 1) > 1e-3  # the paper's plain damping is not invariant


class _Diagonal(torch.nn.Module):
    """Diagonal linear network ``y = x @ (u * v)``: one scaling group on (u, v)."""

    def __init__(self, d=6):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.u = torch.nn.Parameter(torch.randn(d, generator=gen, dtype=torch.float64))
        self.v = torch.nn.Parameter(torch.randn(d, generator=gen, dtype=torch.float64))

    def forward(self, x):
        return x @ (self.u * self.v)


def _diagonal():
    import wsym

    model = _Diagonal()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    y = torch.randn(5, generator=gen, dtype=torch.float64)
    return model, wsym.detect(model, x), [(x, y)], _mse


def test_scaling_is_gl1_block():
    model, spec, _, _ = _diagonal()
    params = {n: p.detach() for n, p in model.named_parameters()}
    q = quotient.Quotient(spec, params)
    assert [spec.groups[i].kind for i, _ in q.blocks] == ["scaling"]
    (_, block), d = q.blocks[0], params["u"].numel()
    assert block.G.shape == (d, 1, 1) and block.H.shape == (d, 1, 1)
    assert torch.equal(block.G[:, 0, 0], params["u"]) and torch.equal(block.H[:, 0, 0], params["v"])
    assert all(m.all() for m in q.covered.values())
    back = q.scatter([block])
    assert all(torch.equal(back[n], p) for n, p in params.items())


@pytest.mark.parametrize("measure", ["geodesic-inv", "geodesic-mix"])
def test_diagonal_geodesic_invariant(measure):
    model, spec, batches, loss = _diagonal()
    kw = {"spec": spec, "rho": 0.05, "steps": 10}
    value = sharpness(model, batches, loss, measure=measure, **kw)
    adaptive = sharpness(model, batches, loss, measure="adaptive", **kw)
    assert abs(value - adaptive) > 1e-3 * abs(adaptive)
    for seed in range(3):
        other = _moved(model, spec, spec.sample(seed, kinds=["scaling"]))
        moved = sharpness(other, batches, loss, measure=measure, **kw)
        assert abs(moved / value - 1) < RATIO


def _geodesic(detected, name: str, metric: str):
    """The float64 parameters of a detected case and their :class:`Geodesic` geometry."""
    from wsym.sharpness.perturbation import Geodesic

    model, _, spec = detected(name)
    params = {n: p.detach().double() for n, p in model.named_parameters()}
    return params, Geodesic(params, spec, metric)


@pytest.mark.parametrize("name", ["tiny-transformer", "bert"])
@pytest.mark.parametrize("metric", ["invariant", "mixed"])
def test_stack_padding_rows_stay_zero(detected, name, metric):
    """Blocks stacked with zero-padded rows: draws, pullbacks and gradients keep them zero."""
    params, geom = _geodesic(detected, name, metric)
    padded = [r for r in geom.quotient.rows if r is not None]
    assert padded, "the case must have blocks of different row counts"
    gen = torch.Generator().manual_seed(0)
    xi = [0.01 * x for x in geom.random(gen)]
    _, pullback = geom.linearize(xi)
    grads = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params.values()]
    for tangent in (xi, geom.gradient(pullback(grads))):
        for pair, rows in zip(geom._pairs(tangent), geom.quotient.rows, strict=True):
            if rows is not None:
                assert torch.equal(pair.G * (1 - rows.G), torch.zeros_like(pair.G))
                assert torch.equal(pair.H * (1 - rows.H), torch.zeros_like(pair.H))
    # the stacked scatter drops padding and agrees with the per-block scatter
    back = geom.quotient.scatter_stacks(geom.quotient.stacks)
    per_block = geom.quotient.scatter([b for _, b in geom.quotient.blocks])
    for n in params:
        assert torch.equal(back[n], per_block[n])


@pytest.mark.parametrize("name", ["tiny-transformer", "bert"])
@pytest.mark.parametrize("metric", ["invariant", "mixed"])
def test_gradient_norm_is_the_metric_norm(detected, name, metric):
    """``|gradient(g)|`` from ``<g, gradient(g)>`` is the metric norm; every name moves."""
    params, geom = _geodesic(detected, name, metric)
    assert len(geom.slots) < len(geom.names), "some parameter lies inside the blocks entirely"
    gen = torch.Generator().manual_seed(1)
    g = [torch.randn(c.shape, generator=gen, dtype=c.dtype) for c in geom.coordinates()]
    d = geom.gradient(g)
    torch.testing.assert_close(geom.gradient_norm(g, d), geom.norm(d), rtol=1e-10, atol=0)
    moved = geom.point([0.01 * x for x in geom.random(gen)])
    assert list(moved) == list(params)
    # a key bias is vertical entirely (softmax ignores it): no horizontal direction moves it
    # at the balanced point, where it is zero; here the geodesic's curvature term may
    gauge = {g.target[0] for g in geom.quotient.spec.groups if g.kind == "translation"}
    inside = [n for n in geom.names if n not in geom.slots and n not in gauge]
    assert all(not torch.equal(moved[n], params[n]) for n in inside)
