"""Batched zoo training against a plain per-member loop, and its grouping independence."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from wsym.zoo import stacked_optim
from wsym.zoo.architectures import initialise
from wsym.zoo.backends import plan_member
from wsym.zoo.batched import train_members
from wsym.zoo.presets import load_preset
from wsym.zoo.streams import BLOCK, DataStream, member_streams
from wsym.zoo.tasks import load_task

DTYPE = torch.float64
TINY = {"epochs": 1, "train_fraction": 0.04}


def plans(preset, ids, seed=0):
    return [plan_member(preset, seed, i) for i in ids]


@pytest.fixture(scope="module")
def mlp():
    preset = load_preset("mnist1d-mlp", {"hyperparameters": TINY})
    return preset, load_task(preset["dataset"])


def assert_same_members(a, b):
    assert [r.id for r in a] == [r.id for r in b]
    for x, y in zip(a, b, strict=True):
        assert x.state_dict.keys() == y.state_dict.keys()
        for k in x.state_dict:
            assert torch.equal(x.state_dict[k], y.state_dict[k]), (x.id, k)
        assert x.metrics == y.metrics


@pytest.mark.parametrize(
    "name, exact", [("mnist1d-mlp", True), ("seq-transformer", True), ("digits-cnn", False)]
)
def test_member_does_not_depend_on_its_group(name, exact):
    # dropout on for every member, so the mask streams are exercised too
    hp = {**TINY, "dropout": 0.2, "train_fraction": 0.06}
    preset = load_preset(name, {"hyperparameters": hp})
    data = load_task(preset["dataset"])
    members = plans(preset, range(6))
    together = train_members(preset, data, members)
    reversed_ = train_members(preset, data, members[::-1])[::-1]
    apart = [train_members(preset, data, [m])[0] for m in members[:3]]
    assert_same_members(together, reversed_)
    if exact:
        assert_same_members(together[:3], apart)
    else:  # oneDNN's grouped convolutions: same up to float32 rounding
        for x, y in zip(together, apart, strict=False):
            for k, v in x.state_dict.items():
                torch.testing.assert_close(v, y.state_dict[k], rtol=1e-4, atol=1e-5)


def test_mlp_members_of_every_batch_size_train_in_lock_step_as_if_alone(mlp):
    # batch sizes 32, 64 and 128 in one stack, SGD and Adam, dropout or not; schedules
    # that end inside a block, at its end and blocks later: every member's bits are
    # those it gets trained alone, and come back in the order given
    hp = {
        "epochs": {"int_uniform": [1, 9]},
        "train_fraction": 0.12,
        "dropout": {"choice": [0, 0.3]},
    }
    preset = load_preset("mnist1d-mlp", {"hyperparameters": hp})
    data = mlp[1]
    members = plans(preset, range(10))
    hps = [m.hyperparameters for m in members]
    assert {h["batch_size"] for h in hps} == {32, 64, 128}
    assert {h["optimizer"] for h in hps} == {"sgd", "adam"}
    assert {h["dropout"] for h in hps} == {0, 0.3}
    together = train_members(preset, data, members)
    steps = [r.metrics["steps"] for r in together]
    assert min(steps) < BLOCK < max(steps) and len(set(steps)) > 5
    alone = [train_members(preset, data, [m])[0] for m in members]
    assert_same_members(together, alone)


def reference_member(preset, data, member):
    """The same member trained the obvious way: one nn.Module, torch.optim, a loop."""
    hp = member.hyperparameters
    seeds = member_streams(member.seed)
    model = initialise(member.architecture, seeds["init"], hp["init_scale"]).to(DTYPE).train()
    stream = DataStream(data, hp, seeds["data"], hp["batch_size"], regression=False)
    if hp["optimizer"] == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])
    else:
        opt = torch.optim.SGD(
            model.parameters(),
            lr=hp["lr"],
            momentum=stacked_optim.MOMENTUM,
            weight_decay=hp["weight_decay"],
        )
    steps = 0
    while steps < stream.total_steps:
        for idx in stream.next_block():
            if steps == stream.total_steps:
                break
            opt.zero_grad()
            x, y = data.x_train[idx].to(DTYPE), stream.targets[idx]
            F.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
    return model.state_dict()


# Not Adam on the CNN: the conv bias feeding BatchNorm has an exactly-zero gradient, so its
# float32 gradient is rounding noise, which Adam normalizes into full-size steps (in the
# batched and the plain loop alike, with different noise).
@pytest.mark.parametrize(
    "name, optimizer", [("mnist1d-mlp", "sgd"), ("mnist1d-mlp", "adam"), ("digits-cnn", "sgd")]
)
def test_batched_training_matches_a_plain_loop(name, optimizer):
    fraction = {"mnist1d-mlp": 0.15, "digits-cnn": 0.4}[name]  # a little over one BLOCK of steps
    hp = {
        "epochs": 2,
        "train_fraction": fraction,
        "dropout": 0.0,
        "optimizer": optimizer,
        "label_noise": 0.2,
        "weight_decay": 1e-3,
        "batch_size": 32,
        # moderate steps: with large ones BatchNorm nets amplify float32 rounding chaotically
        "lr": {"by": "optimizer", "sgd": 0.02, "adam": 0.003},
    }
    preset = load_preset(name, {"hyperparameters": hp})
    data = load_task(preset["dataset"])
    members = plans(preset, range(3))
    batched = train_members(preset, data, members)
    for member, result in zip(members, batched, strict=True):
        assert result.metrics["steps"] > BLOCK
        ref = reference_member(preset, data, member)
        assert ref.keys() == result.state_dict.keys()
        for k, v in ref.items():
            got = result.state_dict[k]
            if v.is_floating_point():
                torch.testing.assert_close(got.double(), v, rtol=2e-4, atol=2e-5, msg=k)
            else:  # BatchNorm's num_batches_tracked
                assert int(got) == int(v) == result.metrics["steps"]


@settings(max_examples=20, deadline=None)
@given(
    lr=st.floats(1e-4, 1.0),
    wd=st.sampled_from([0.0, 1e-3, 0.1]),
    adam=st.booleans(),
    steps=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_optimizer_step_equals_torch_optim(lr, wd, adam, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    p0 = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    grads = [torch.randn(3, 5, generator=gen, dtype=torch.float64) for _ in range(steps)]
    params = {"w": p0[None].clone()}
    state = stacked_optim.init_state(params)
    f64 = torch.float64
    hyper = stacked_optim.Hyper(
        torch.tensor([lr], dtype=f64), torch.tensor([wd], dtype=f64), torch.tensor([adam])
    )
    ref = p0.clone().requires_grad_(True)
    opt = (
        torch.optim.Adam([ref], lr=lr, weight_decay=wd)
        if adam
        else torch.optim.SGD([ref], lr=lr, momentum=stacked_optim.MOMENTUM, weight_decay=wd)
    )
    for g in grads:
        stacked_optim.step(params, {"w": g[None]}, state, hyper)
        ref.grad = g.clone()
        opt.step()
    torch.testing.assert_close(params["w"][0], ref.detach(), rtol=1e-10, atol=1e-12)


def test_label_noise_and_subset_are_per_member(mlp):
    preset, data = mlp
    hp = {**plans(preset, [0])[0].hyperparameters, "label_noise": 0.5, "train_fraction": 0.5}
    stream = DataStream(data, hp, seed=3, batch=32, regression=False)
    n = len(stream.subset)
    assert n == 2000 and int(stream.mask.sum()) == n
    flipped = stream.targets != data.y_train
    assert int(flipped.sum()) == 1000  # exactly half of the subset, always a wrong label
    assert not bool(flipped[~stream.mask].any())
    assert stream.total_steps == hp["epochs"] * (n // 32)
