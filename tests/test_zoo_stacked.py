"""The fast path of batched MLP training: hand-written gradients and optimizer plans."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from wsym.zoo import stacked_mlp, stacked_optim

DTYPE = torch.float64
ACTIVATIONS = [nn.ReLU, nn.Tanh, nn.GELU, nn.LeakyReLU, nn.Sigmoid, nn.Identity]


def stacked_state(modules):
    return {k: torch.stack([m.state_dict()[k] for m in modules]) for k in modules[0].state_dict()}


def autograd_gradients(state, spec, x, y, masks):
    """The same loss through autograd, one member at a time, on the state-dict form."""
    state = {k: v.clone().requires_grad_(True) for k, v in state.items()}
    total = 0.0
    for i in range(len(y)):
        h = x[i]
        for name, act, site in zip(spec.layers, spec.activations, spec.dropout, strict=True):
            h = F.linear(h, state[f"{name}.weight"][i], state[f"{name}.bias"][i])
            if act is not None:
                h = stacked_mlp.activation(act, h)
            if site is not None and site in masks:
                h = h * masks[site][i]
        total = total + F.cross_entropy(h, y[i])
    total.backward()
    return {k: v.grad for k, v in state.items()}


@settings(max_examples=25, deadline=None)
@given(
    act=st.sampled_from(ACTIVATIONS),
    widths=st.lists(st.integers(1, 6), min_size=0, max_size=3),
    members=st.integers(1, 4),
    batch=st.integers(1, 5),
    dropout=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_hand_written_gradients_equal_autograd(act, widths, members, batch, dropout, seed):
    torch.manual_seed(seed)
    dims = [3, *widths, 4]
    layers = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 2:
            layers.append(act())
    modules = [nn.Sequential(*layers).to(DTYPE) for _ in range(members)]
    for m in modules:
        for p in m.parameters():
            nn.init.normal_(p)
    sites = [str(2 * i + 1) for i in range(len(widths))] if dropout else []
    spec = stacked_mlp.mlp_spec(modules[0], sites)
    assert spec.layers == tuple(str(2 * i) for i in range(len(widths) + 1))
    x = torch.randn(members, batch, 3, dtype=DTYPE)
    y = torch.randint(0, 4, (members, batch))
    masks = {
        site: (torch.rand(members, batch, w) > 0.3).to(DTYPE) / 0.7
        for site, w in zip(sites, widths, strict=False)  # no sites: no dropout
    }
    state = stacked_state(modules)
    params = stacked_mlp.pack(state, spec)
    got = stacked_mlp.loss_gradients(params, stacked_mlp.with_ones(x), y, masks, spec)
    expected = autograd_gradients(state, spec, x, y, masks)
    for name, value in stacked_mlp.unpack(got, spec).items():
        torch.testing.assert_close(value, expected[name], rtol=1e-10, atol=1e-12, msg=name)


def test_reused_buffers_and_out_tensors_give_the_same_gradients():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3))
    spec = stacked_mlp.mlp_spec(base, ["1", "3"])
    state = {k: torch.randn(3, *v.shape) for k, v in base.state_dict().items()}
    params = stacked_mlp.pack(state, spec)
    out = [torch.empty_like(p) for p in params]
    gradients = stacked_mlp.LossGradients(params, spec, 6, out)
    for step in range(3):  # buffers reused across calls must not leak between them
        x = stacked_mlp.with_ones(torch.randn(3, 6, 5))
        y = torch.randint(0, 3, (3, 6))
        masks = {"1": (torch.rand(3, 6, 4) > 0.5).float() * 2}
        if step == 1:
            masks["3"] = (torch.rand(3, 6, 4) > 0.5).float() * 2
        fresh = stacked_mlp.loss_gradients(params, x, y, masks, spec)
        reused = gradients(x, y, masks)
        assert all(torch.equal(a, b) for a, b in zip(fresh, reused, strict=True))
        assert all(a is b for a, b in zip(reused, out, strict=True))
        with torch.no_grad():
            params[0].add_(0.1)  # a call sees the parameters' current values


def test_non_mlps_have_no_spec():
    assert stacked_mlp.mlp_spec(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), []) is None
    assert stacked_mlp.mlp_spec(nn.Sequential(nn.Conv1d(1, 1, 3), nn.ReLU()), []) is None
    assert stacked_mlp.mlp_spec(nn.Sequential(nn.Linear(2, 2, bias=False)), []) is None
    assert stacked_mlp.mlp_spec(nn.Sequential(nn.Linear(2, 2), nn.LeakyReLU(0.2)), []) is None
    assert stacked_mlp.mlp_spec(nn.Sequential(nn.Linear(2, 2)), ["0"]) is None


def run_plan(params, grads_seq, hyper, small):
    stack = stacked_optim.FlatStack({k: v.clone() for k, v in params.items()})
    old = stacked_optim.SMALL_STACK
    stacked_optim.SMALL_STACK = small
    try:
        plan = stack.plan(hyper)
    finally:
        stacked_optim.SMALL_STACK = old
    for grads in grads_seq:
        for k, v in stack.views("grad").items():
            v.copy_(grads[k])
        plan.step()
    return stack.views("param")


@pytest.mark.parametrize("steps", [1, 3])
def test_a_member_gets_the_same_bits_whatever_plan_updates_it(steps):
    """Both rules on one tensor, each rule on its rows, or the member alone: same bits."""
    gen = torch.Generator().manual_seed(steps)
    m = 5
    params = {"w": torch.randn(m, 7, 3, generator=gen), "b": torch.randn(m, 7, generator=gen)}
    grads_seq = [{k: torch.randn(v.shape, generator=gen) for k, v in params.items()}] * steps
    hyper = stacked_optim.Hyper(
        torch.rand(m, generator=gen) * 0.1,
        torch.tensor([0.0, 1e-3, 0.1, 0.0, 1e-2]),
        torch.tensor([False, False, True, True, True]),
    )
    mixed = run_plan(params, grads_seq, hyper, small=2**30)
    split = run_plan(params, grads_seq, hyper, small=0)
    for k in params:
        assert torch.equal(mixed[k], split[k])
    for i in range(m):
        row = torch.tensor([i])
        alone = run_plan(
            {k: v[row] for k, v in params.items()},
            [{k: v[row] for k, v in g.items()} for g in grads_seq],
            hyper.select(row),
            small=2**30,
        )
        for k in params:
            assert torch.equal(alone[k][0], mixed[k][i]), (i, k)


def test_unordered_members_equal_ordered_ones():
    gen = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(4, 6, generator=gen)}
    grads = {"w": torch.randn(4, 6, generator=gen)}
    is_adam = torch.tensor([True, False, True, False])
    hyper = stacked_optim.Hyper(torch.full((4,), 0.05), torch.full((4,), 1e-3), is_adam)
    assert hyper.n_sgd is None
    order = torch.argsort(is_adam.to(torch.int8), stable=True)
    a = {"w": params["w"].clone()}
    b = {"w": params["w"][order].clone()}
    state_a, state_b = stacked_optim.init_state(a), stacked_optim.init_state(b)
    for _ in range(2):
        stacked_optim.step(a, grads, state_a, hyper)
        stacked_optim.step(b, {"w": grads["w"][order]}, state_b, hyper.select(order))
    assert torch.equal(a["w"][order], b["w"])
    assert float(state_a["step"]) == 2.0
