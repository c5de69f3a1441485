"""Alignment, merging and interpolation barriers."""

import copy

import pytest
import torch
from test_canon import double

import wsym
from wsym.errors import WsymInputError
from wsym.models.networks import MLP

CASES = [
    "mlp-relu",
    "mlp-tanh",
    "residual-cnn",
    "tiny-transformer",
    "tiny-transformer-rotary",
    "bert",
    "gqa",
    "concat",
    "e3nn-gate",
    "tied-embedding",
    pytest.param("resnet18", marks=pytest.mark.slow),
]


def distance(a, b):
    return max(
        float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12))
        for k in a
        if a[k].is_floating_point() and a[k].numel()
    )


@pytest.mark.parametrize("name", CASES)
def test_align_recovers_a_moved_copy_exactly(detected, name):
    model, _, spec = detected(name)
    sd = double(model.state_dict())
    moved = spec.act(spec.sample(seed=7, scale=(1e-2, 1e2)), sd)
    assert distance(sd, moved) > 1e-2
    assert distance(sd, wsym.align(sd, moved, spec)) < 1e-8


def test_activation_matching_recovers_a_permuted_copy(detected):
    model, inputs, spec = detected("tiny-transformer")
    sd = double(model.state_dict())
    moved = spec.act(spec.sample(seed=3, kinds=["permutation"]), sd)
    batches = [(torch.randn(16, 6, 4), None) for _ in range(3)]
    back = wsym.align(sd, moved, spec, "activations", model=model, batches=batches)
    assert distance(sd, back) < 1e-8


def test_merge_of_a_model_and_its_moved_copy_is_the_model(detected):
    model, _, spec = detected("residual-cnn")
    sd = double(model.state_dict())
    merged = wsym.merge(
        [sd, spec.act(spec.sample(seed=2), sd), spec.act(spec.sample(seed=5), sd)], spec
    )
    assert distance(sd, merged) < 1e-8


def test_merge_resets_batchnorm_statistics(detected):
    model, _, spec = detected("residual-cnn")
    model64 = copy.deepcopy(model).double()
    sd = model64.state_dict()
    batches = [(torch.randn(8, 1, 6, 6, dtype=torch.float64), None) for _ in range(2)]
    moved = spec.act(spec.sample(seed=2), sd)
    merged = wsym.merge([sd, moved], spec, model=model64, batches=batches, reset_batchnorm=True)
    x = torch.cat([b[0] for b in batches])
    stem = torch.nn.functional.conv2d(x, sd["stem.0.weight"], sd["stem.0.bias"], padding=1)
    torch.testing.assert_close(merged["stem.1.running_mean"], stem.mean((0, 2, 3)))


def test_interpolation_barrier():
    torch.manual_seed(0)
    model = MLP(4, [6], 3)
    sd_a = double(model.state_dict())
    sd_b = double(MLP(4, [6], 3).state_dict())
    batches = [(torch.randn(20, 4).double(), torch.randint(0, 3, (20,)))]
    loss = torch.nn.functional.cross_entropy
    same = wsym.interpolate(model.double(), sd_a, sd_a, batches, loss, steps=5)
    assert same.barrier == pytest.approx(0.0, abs=1e-12) and len(same.losses) == 5
    curve = wsym.interpolate(model, sd_a, sd_b, batches, loss, steps=5)
    assert curve.barrier >= 0 and curve.losses[0] != curve.losses[-1]


def test_bad_checkpoints_are_named(detected):
    model, _, spec = detected("mlp-relu")
    sd = double(model.state_dict())
    other = dict(sd)
    other["2.weight"] = torch.zeros(3, 3, dtype=torch.float64)
    with pytest.raises(WsymInputError, match="2.weight has shape"):
        wsym.align(sd, other, spec)
    nan = dict(sd)
    nan["0.bias"] = torch.full_like(sd["0.bias"], float("nan"))
    with pytest.raises(WsymInputError, match="0.bias holds NaN"):
        wsym.merge([sd, nan], spec)
    missing = {k: v for k, v in sd.items() if k != "0.weight"}
    with pytest.raises(WsymInputError, match="no tensor '0.weight'"):
        wsym.align(sd, missing, spec)


def test_activation_matching_recovers_a_permuted_sign_flipped_copy(detected):
    """LayerNorm outputs flip with their sign group: the residual stream is still matched."""
    model, _, spec = detected("tiny-transformer")
    sd = double(model.state_dict())
    moved = spec.act(spec.sample(seed=5, kinds=["permutation", "sign"]), sd)
    batches = [(torch.randn(16, 6, 4), None) for _ in range(3)]
    back = wsym.align(sd, moved, spec, "activations", model=model, batches=batches)
    assert distance(sd, back) < 1e-8


def test_activations_then_weights_keeps_the_function_and_lowers_the_seed(detected):
    """Activation matching's permutations are only the start: weight matching then moves on."""
    from wsym.align.alignment import SIGNS, activation_matching
    from wsym.align.canonicalize import canonical_element
    from wsym.align.continuous import mismatch
    from wsym.group.elements import GroupElement, act

    model, _, spec = detected("tiny-transformer")
    sd = double(model.state_dict())
    torch.manual_seed(11)
    other = {
        k: v + 0.3 * torch.randn_like(v) if v.is_floating_point() else v for k, v in sd.items()
    }
    other = spec.act(spec.sample(seed=4, kinds=["permutation", "sign"]), other)
    batches = [(torch.randn(16, 6, 4), None) for _ in range(3)]
    back = wsym.align(sd, other, spec, "activations+weights", model=model, batches=batches)
    x = torch.randn(5, 6, 4, dtype=torch.float64)
    net = copy.deepcopy(model).double()
    outs = []
    for state in (other, back):
        net.load_state_dict(state)
        outs.append(net(x))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-9, rtol=1e-9)
    ref, _ = canonical_element(sd, spec, kinds=SIGNS)
    start, _ = canonical_element(other, spec, kinds=SIGNS)
    perms, _ = activation_matching(spec, model, ref, start, batches)
    seeded = act(spec, GroupElement(tuple(perms)), start)
    assert mismatch(spec, sd, back) < mismatch(spec, ref, seeded)
    moved = spec.act(spec.sample(seed=5, kinds=["permutation", "sign"]), sd)
    back = wsym.align(sd, moved, spec, "activations+weights", model=model, batches=batches)
    assert distance(sd, back) < 1e-8
