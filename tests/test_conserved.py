"""Conserved quantities along gradient descent (float64).

Along small steps on a real loss every quadratic quantity drifts by ``O(lr^2)``
per step (halving ``lr`` divides the drift by about 4), a translation's is
constant to round-off, and weight decay ``lam`` multiplies them by
``(1 - lr lam)^2`` (``1 - lr lam``) per step to leading order: on a ReLU MLP, a
BatchNorm CNN (training mode: batch statistics) and the tiny transformer.
"""

import pytest
import torch
from cases import BY_NAME

from wsym.group.conserved import conserved, decay, degree

NAMES = ["mlp-relu", "residual-cnn", "tiny-transformer"]


def _setup(detected, name):
    model, inputs, spec = detected(name)
    model = BY_NAME[name].build().double()  # a copy: training mode must not leak
    model.load_state_dict(detected(name)[0].state_dict())
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eps = 1e-12  # scale invariance of batch statistics, exact up to eps
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((16, *inputs.shape[1:]), generator=gen, dtype=torch.float64)
    with torch.no_grad():
        classes = model(x).shape[-1]
    y = torch.randint(0, classes, (16,), generator=gen)
    state = {k: v.double() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    names = [k for k, _ in model.named_parameters()]
    return model.train(), spec, state, names, x, y


def _descend(model, state, names, x, y, lr, steps, weight_decay=0.0):
    state = dict(state)
    for _ in range(steps):
        params = [state[k].clone().requires_grad_(True) for k in names]
        full = {**{k: v.clone() for k, v in state.items()}, **dict(zip(names, params, strict=True))}
        out = torch.func.functional_call(model, full, (x,))
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(out, y), params)
        for k, p, g in zip(names, params, grads, strict=True):
            state[k] = (1 - lr * weight_decay) * p.detach() - lr * g
    return state


def _drift(spec, before, after, lr=0.0, weight_decay=0.0) -> dict:
    q0, q1 = conserved(spec, before), conserved(spec, after)
    return {
        i: float((q1[i] - decay(spec.groups[i], lr, weight_decay) * q0[i]).abs().max()) for i in q0
    }


@pytest.mark.parametrize("name", NAMES)
def test_quantities_drift_by_lr_squared(detected, name):
    model, spec, state, names, x, y = _setup(detected, name)
    lr = 2e-3
    big = _drift(spec, state, _descend(model, state, names, x, y, lr, 4))
    small = _drift(spec, state, _descend(model, state, names, x, y, lr / 2, 8))
    assert big, "no conserved quantity"
    for i in big:
        g = spec.groups[i]
        if degree(g) == 1:  # linear: the gradient has no component along translations
            assert big[i] < 1e-12 and small[i] < 1e-12, g.kind
        else:  # same time span lr * steps: the drift halves with lr (lr^2 per step)
            assert big[i] > 0, g.kind
            ratio = big[i] / small[i]
            assert 1.8 < ratio < 2.2, (g.kind, ratio)
    one = _drift(spec, state, _descend(model, state, names, x, y, lr, 1))
    half = _drift(spec, state, _descend(model, state, names, x, y, lr / 2, 1))
    for i in one:
        if degree(spec.groups[i]) == 2:
            assert 3.99 < one[i] / half[i] < 4.01, spec.groups[i].kind  # exactly lr^2 Q(grad)


@pytest.mark.parametrize("name", NAMES)
def test_weight_decay_shrinks_the_quantities_as_predicted(detected, name):
    model, spec, state, names, x, y = _setup(detected, name)
    lr, lam = 1e-3, 0.5
    q0 = conserved(spec, state)
    after = _descend(model, state, names, x, y, lr, 1, weight_decay=lam)
    plain = _drift(spec, state, _descend(model, state, names, x, y, lr, 1))
    decayed = _drift(spec, state, after, lr, lam)
    for i, q in q0.items():
        g = spec.groups[i]
        moved = float((conserved(spec, after)[i] - q).abs().max())
        # the prediction removes the decay, leaving the lr^2 drift of plain descent
        assert decayed[i] <= 1.01 * plain[i] + 1e-14 * float(q.abs().max()), g.kind
        if float(q.abs().max()) > 1e-3:
            assert moved > 10 * decayed[i], g.kind  # the decay itself was predicted
