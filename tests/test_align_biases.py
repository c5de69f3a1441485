"""Biases left out of weight matching's scores: which ones, same function, planted copies."""

import pytest
import torch
from cases import BY_NAME
from test_canon import double
from test_detect import as_float64, outputs

import wsym
from wsym.align.biases import unmatched_biases, without
from wsym.align.continuous import mismatch
from wsym.errors import WsymInputError
from wsym.models.networks import MLP, CNN1d


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("mlp-relu", {"0.bias", "2.bias"}),
        ("mlp-gelu", set()),  # no scaling group: nothing tells a bias from a weight
        ("tiny-transformer", set()),  # its MLP units read a LayerNorm's output
        ("residual-cnn", {"stem.0.bias"}),  # the stem reads the input; conv1/conv2 have no bias
    ],
)
def test_unmatched_biases_tables(detected, name, expected):
    _, _, spec = detected(name)
    assert set(unmatched_biases(spec)) == expected


def test_unmatched_biases_follow_the_structure_not_the_exponent_signs():
    """A deeper MLP (its third scaling group is stored with flipped signs) and a BatchNorm CNN."""
    mlp = wsym.detect(MLP(4, [5, 5, 5], 2), torch.randn(3, 4))
    assert set(unmatched_biases(mlp)) == {"0.bias", "2.bias", "4.bias"}
    cnn = wsym.detect(CNN1d(), torch.randn(3, 40))
    assert set(unmatched_biases(cnn)) == {"conv1.bias"}  # conv2 reads BatchNorm's output


@pytest.mark.parametrize("name", ["mlp-relu", "residual-cnn", "tiny-transformer"])
def test_default_alignment_keeps_the_function_and_never_raises_the_objective(detected, name):
    model, inputs, spec = detected(name)
    ref = double(model.state_dict())
    for seed in range(3):
        torch.manual_seed(10 + seed)
        other = double(BY_NAME[name].build().state_dict())
        aligned = wsym.align(ref, other, spec, seed=seed)
        net, x = as_float64(model, inputs)
        before, after = outputs(net, other, x), outputs(net, aligned, x)
        assert float((after - before).abs().max()) <= 1e-9 * float(before.abs().max())
        assert mismatch(spec, ref, aligned) <= mismatch(spec, ref, other) * (1 + 1e-12)


def test_a_planted_permutation_and_scaling_is_recovered_without_the_biases(detected):
    """The incoming and outgoing weights alone pin the units: the copy comes back exactly."""
    model, _, spec = detected("mlp-relu")
    sd = double(model.state_dict())
    moved = spec.act(spec.sample(seed=2, scale=(0.5, 2.0)), sd)
    back = wsym.align(sd, moved, spec)
    assert mismatch(spec, sd, back) <= 1e-12 * mismatch(spec, sd, moved)


def test_without_zeroes_only_the_named_tensors():
    sd = {"w": torch.ones(2, 2), "b": torch.ones(2)}
    out = without(sd, {"b"})
    assert torch.equal(out["w"], sd["w"]) and not out["b"].any()
    assert without(sd, frozenset()) is sd


def test_unknown_biases_option_is_one_line(detected):
    model, _, spec = detected("mlp-relu")
    sd = double(model.state_dict())
    with pytest.raises(WsymInputError, match="unknown biases 'none'"):
        wsym.align(sd, sd, spec, biases="none")
