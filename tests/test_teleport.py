"""wsym.teleport: the loss stays put (1e-6 relative) while the objective improves."""

import copy
import warnings

import pytest
import torch
from torch.nn import functional as F

import wsym
from wsym.errors import SymmetryWarning, WsymInputError
from wsym.models.networks import MLP, ResidualCNN
from wsym.sharpness.curvature import gradient, hessian_trace


def _batches(shape, classes=3, n=2, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(16, *shape, generator=gen, dtype=torch.float64),
            torch.randint(0, classes, (16,), generator=gen),
        )
        for _ in range(n)
    ]


def _loss(model, batches):
    with torch.no_grad():
        return sum(float(F.cross_entropy(model(x), y)) for x, y in batches) / len(batches)


def _grad_norm(model, batches):
    g = gradient(model, None, batches, F.cross_entropy)
    return float(sum((t * t).sum() for t in g.values()))


@pytest.mark.parametrize("activation", ["relu", "identity"])  # scaling; GL
def test_teleport_keeps_loss_and_increases_grad_norm(activation):
    torch.manual_seed(0)
    model = MLP(5, [8, 6], 3, activation).double().eval()
    batches = _batches((5,))
    spec = wsym.detect(model, batches[0][0])
    loss0, norm0 = _loss(model, batches), _grad_norm(model, batches)
    params = list(model.parameters())
    out = wsym.teleport(model, spec, batches, F.cross_entropy, steps=10, lr=0.2)
    assert out is model and all(
        a is b for a, b in zip(params, model.parameters(), strict=True)
    )  # in place
    assert abs(_loss(model, batches) - loss0) <= 1e-6 * abs(loss0)
    assert _grad_norm(model, batches) > 1.5 * norm0


def test_teleport_sharpness_objective_lowers_hessian_trace():
    torch.manual_seed(0)
    model = MLP(5, [8], 3).double().eval()
    batches = _batches((5,), n=1)
    spec = wsym.detect(model, batches[0][0])  # start from an unbalanced point of the orbit
    model.load_state_dict(spec.act(spec.sample(seed=1, scale=(0.2, 5.0)), model.state_dict()))
    loss0 = _loss(model, batches)
    trace0 = hessian_trace(model, batches, F.cross_entropy, probes="exact")
    wsym.teleport(model, spec, batches, F.cross_entropy, objective="sharpness", steps=8, lr=0.2)
    # measured: 3.06 -> 1.92
    assert abs(_loss(model, batches) - loss0) <= 1e-6 * abs(loss0)
    assert hessian_trace(model, batches, F.cross_entropy, probes="exact") < 0.75 * trace0


def test_teleport_float32_and_batchnorm_model():
    torch.manual_seed(0)
    model = ResidualCNN(channels=4).eval()  # norm_scaling groups before BatchNorm
    batches = [(x.float(), y) for x, y in _batches((1, 8, 8), classes=10, n=1)]
    spec = wsym.detect(model, batches[0][0])
    loss0 = _loss(model, batches)
    buffers = {k: v.clone() for k, v in model.state_dict().items()}
    wsym.teleport(model, spec, batches, F.cross_entropy, steps=3, lr=0.1)
    assert abs(_loss(model, batches) - loss0) <= 1e-5 * abs(loss0)  # float32 round-off
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, buffers[k])]
    assert moved


def test_teleport_refuses_a_move_that_changes_the_loss():
    torch.manual_seed(0)
    relu = MLP(5, [8], 3).double()
    batches = _batches((5,))
    spec = wsym.detect(relu, batches[0][0])  # scaling holds for ReLU, not for tanh
    tanh = MLP(5, [8], 3, "tanh").double()
    tanh.load_state_dict(relu.state_dict())
    before = copy.deepcopy(tanh.state_dict())
    with pytest.warns(SymmetryWarning, match="not moved"):
        wsym.teleport(tanh, spec, batches, F.cross_entropy, steps=3, lr=0.5)
    for k, v in tanh.state_dict().items():
        assert torch.equal(v, before[k])


def test_teleport_detects_spec_when_none():
    torch.manual_seed(0)
    model = MLP(5, [8], 3).double()
    batches = _batches((5,), n=1)
    norm0 = _grad_norm(model, batches)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SymmetryWarning)
        wsym.teleport(model, None, batches, F.cross_entropy, steps=3, lr=0.2)
    assert _grad_norm(model, batches) > norm0


def test_teleport_bad_input():
    model = MLP(5, [4], 3, "tanh").double()
    batches = _batches((5,), n=1)
    spec = wsym.detect(model, batches[0][0])
    with pytest.raises(WsymInputError, match="continuous symmetries"):
        wsym.teleport(model, spec, batches, F.cross_entropy)
    relu = MLP(5, [4], 3).double()
    spec = wsym.detect(relu, batches[0][0])
    for kw, msg in (
        ({"objective": "loss"}, "unknown objective"),
        ({"steps": 0}, "steps"),
        ({"lr": -1.0}, "lr"),
    ):
        with pytest.raises(WsymInputError, match=msg):
            wsym.teleport(relu, spec, batches, F.cross_entropy, **kw)
    with pytest.raises(WsymInputError, match="empty"):
        wsym.teleport(relu, spec, [], F.cross_entropy)


def test_teleport_trace_is_the_hutchinson_estimate_of_curvature():
    from wsym.optim.teleport import _objective, _probes

    torch.manual_seed(0)
    model = MLP(5, [8], 3).double().eval()
    batches = _batches((5,))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    names = [n for n, _ in model.named_parameters()]
    for n in names:
        state[n].requires_grad_(True)
    vs = _probes(state, names, 6, seed=2)
    ours = -float(
        _objective(model, state, names, batches, F.cross_entropy, "sharpness", vs).detach()
    )
    theirs = hessian_trace(model, batches, F.cross_entropy, probes=6, seed=2)
    assert abs(ours - theirs) <= 1e-10 * abs(theirs)


@pytest.mark.parametrize("kind", ["orthogonal", "translation"])
def test_teleport_moves_along_any_continuous_kind_it_is_given(kind):
    from wsym.models.networks import TinyTransformer

    torch.manual_seed(0)
    rotary = kind == "orthogonal"
    model = TinyTransformer(patch=4, seq=6, dim=8, heads=2, depth=1, hidden=12, rotary=rotary)
    model = model.double().eval()
    batches = [(x.reshape(16, 6, 4)[:, :, :4], y) for x, y in _batches((24,), classes=10, n=1)]
    spec = wsym.detect(model, batches[0][0])
    assert any(g.kind == kind for g in spec.groups)
    loss0 = _loss(model, batches)
    wsym.teleport(model, spec, batches, F.cross_entropy, steps=3, lr=0.2, kinds=("gl", kind))
    assert abs(_loss(model, batches) - loss0) <= 1e-6 * abs(loss0)
