"""Every registry architecture: exact group table, exact invariance, act/inverse round trip."""

import copy

import pytest
import torch
from cases import CASES
from torch.func import functional_call
from torch.utils._pytree import tree_flatten

from wsym.models.calling import split_inputs

IDS = [c.name for c in CASES]
PARAMS = [pytest.param(c.name, marks=pytest.mark.slow) if c.slow else c.name for c in CASES]


def outputs(model, state, inputs):
    args, kwargs = split_inputs(inputs)
    with torch.no_grad():
        out = functional_call(model, state, args, kwargs, tie_weights=False)
    leaves, _ = tree_flatten(out)
    return torch.cat(
        [x.reshape(-1) for x in leaves if torch.is_tensor(x) and x.is_floating_point()]
    )


def as_float64(model, inputs):
    model = copy.deepcopy(model).double().eval()
    args, kwargs = split_inputs(inputs)
    args = tuple(a.double() if a.is_floating_point() else a for a in args)
    kwargs = {k: v.double() if v.is_floating_point() else v for k, v in kwargs.items()}
    return model, (kwargs if kwargs else args)


@pytest.mark.parametrize("name", PARAMS)
def test_group_table(detected, name):
    _, _, spec = detected(name)
    case = next(c for c in CASES if c.name == name)
    assert spec.kinds() == case.expected, spec.table()
    assert all(d <= 1e-6 for d in spec.deviations)


@pytest.mark.parametrize("name", PARAMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_elements_preserve_outputs(detected, name, seed):
    model, inputs, spec = detected(name)
    model, inputs = as_float64(model, inputs)
    sd = model.state_dict()
    g = spec.sample(seed=seed, scale=(1e-2, 1e2))
    moved = spec.act(g, sd)
    changed = [k for k in sd if not torch.equal(sd[k], moved[k])]
    assert changed, "a random group element should move some parameters"
    y0, y1 = outputs(model, sd, inputs), outputs(model, moved, inputs)
    case = next(c for c in CASES if c.name == name)
    assert (y1 - y0).abs().max() <= case.tol * y0.abs().max()


@pytest.mark.parametrize("name", PARAMS)
def test_act_inverse_round_trip(detected, name):
    model, inputs, spec = detected(name)
    sd = {k: v.double() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    g = spec.sample(seed=3)
    back = spec.act(g.inverse(), spec.act(g, sd))
    for k in sd:
        torch.testing.assert_close(back[k], sd[k], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", [c.name for c in CASES if not c.slow])
def test_each_group_verifies_alone(detected, name):
    """Group testing in detect checks sets jointly; here every group is checked on its own."""
    model, inputs, spec = detected(name)
    report = spec.verify(model, inputs)
    assert report.ok, [
        (g.notation, g.params[:2], d) for g, d in zip(spec.groups, report.deviations, strict=True)
    ]
