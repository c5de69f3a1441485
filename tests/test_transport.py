"""Optimizer-state transport: after a symmetry move, the pending step moves the function alike."""

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import wsym
from wsym.errors import WsymInputError
from wsym.models.networks import MLP
from wsym.optim import SAM
from wsym.optim.transport import transport_state


def _data(d=4, classes=3, n=32):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, classes, (n,), generator=gen)


def _trained(model, make, x, y, steps=5):
    opt = make(model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return opt


def _moved(model, opt, make, spec, g, transport):
    """A copy of the run teleported by ``g``, its state transported or left as is."""
    other = copy.deepcopy(model)
    other_opt = make(other.parameters())
    other_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    other.load_state_dict(spec.act(g, before))
    if transport:
        transport_state(other_opt, other, spec, g, before)
    return other, other_opt


def _update(model, opt, x, y, coast):
    """Function-space change of the next step (``coast``: gradients zero, the pending move)."""
    f0 = model(x).detach()
    opt.zero_grad()
    if coast:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
    else:
        F.cross_entropy(model(x), y).backward()
    opt.step()
    return model(x).detach() - f0


def _sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _adam(params):
    return torch.optim.Adam(params, lr=0.01)


def _check(model, make, kinds, coast, scale=(0.3, 3.0)):
    x, y = _data(model[0].in_features)
    opt = _trained(model, make, x, y)
    spec = wsym.detect(model, x)
    g = spec.sample(seed=2, scale=scale, kinds=kinds)
    assert g.components, kinds
    moved, moved_opt = _moved(model, opt, make, spec, g, transport=True)
    stale, stale_opt = _moved(model, opt, make, spec, g, transport=False)
    reference = _update(model, opt, x, y, coast)
    after = _update(moved, moved_opt, x, y, coast)
    torch.testing.assert_close(after, reference, rtol=0, atol=1e-12)
    assert float((_update(stale, stale_opt, x, y, coast) - reference).abs().max()) > 1e-4


@pytest.mark.parametrize("make", [_sgd, _adam], ids=["sgd-momentum", "adam"])
def test_pending_step_is_pushed_forward_under_scalings(make):
    torch.manual_seed(0)
    _check(MLP(4, [6, 5], 3).double(), make, ("scaling",), coast=True)


def test_pending_momentum_step_is_pushed_forward_under_gl():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 3)).double()  # GL(5) between them
    _check(model, _sgd, ("gl",), coast=True)


@pytest.mark.parametrize("make", [_sgd, _adam], ids=["sgd-momentum", "adam"])
def test_whole_next_step_is_equivariant_under_permutations(make):
    torch.manual_seed(0)
    _check(MLP(4, [6, 5], 3).double(), make, ("permutation",), coast=False)


def test_teleport_moves_the_optimizer_state_with_the_weights():
    torch.manual_seed(0)
    model = MLP(4, [6, 5], 3).double()
    x, y = _data()
    opt = _trained(model, _sgd, x, y)
    reference_model = copy.deepcopy(model)
    reference_opt = _sgd(reference_model.parameters())
    reference_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    spec = wsym.detect(model, x)
    before = [p.detach().clone() for p in model.parameters()]
    wsym.teleport(model, spec, [(x, y)], F.cross_entropy, steps=5, lr=0.5, optimizer=opt)
    change = [
        float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before, strict=True)
    ]
    assert max(change) > 1e-3
    reference = _update(reference_model, reference_opt, x, y, coast=True)
    after = _update(model, opt, x, y, coast=True)
    torch.testing.assert_close(after, reference, rtol=0, atol=1e-12)


def test_wrapped_optimizers_and_float32_state():
    torch.manual_seed(0)
    model = MLP(4, [6], 3)
    x, y = _data()
    x = x.float()
    opt = SAM(model, rho=0.05, lr=0.1, momentum=0.9)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    opt.step(closure)
    spec = wsym.detect(model, x)
    g = spec.sample(seed=0, scale=(0.5, 2.0), kinds=("scaling",))
    w = model[0].weight
    buffer = opt.base_optimizer.state[w]["momentum_buffer"].clone()
    transport_state(opt, model, spec, g)
    moved = opt.base_optimizer.state[w]["momentum_buffer"]
    assert moved.dtype == torch.float32
    s = g.components[0][1].float()  # the first hidden layer's scales: rows of w times s
    torch.testing.assert_close(moved, buffer * s[:, None])


def test_optimizer_of_another_model_is_refused():
    torch.manual_seed(0)
    model, other = MLP(4, [6], 3).double(), MLP(4, [6], 3).double()
    x, _ = _data()
    spec = wsym.detect(model, x)
    g = spec.sample(seed=0, scale=(0.5, 2.0), kinds=("scaling",))
    with pytest.raises(WsymInputError, match="not the model's"):
        transport_state(_sgd(other.parameters()), model, spec, g)
