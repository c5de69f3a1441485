"""Every public entry point refuses a wrong type or shape in one WsymInputError line.

(A module where a state dict belongs and back, a spec of another architecture,
batches that are not ``(inputs, targets)`` pairs, a loss that is not callable.)
"""

import pytest
import torch

import wsym
from wsym.errors import WsymInputError

torch.manual_seed(0)
MLP = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
OTHER = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
X, Y = torch.randn(3, 4), torch.tensor([0, 1, 0])
SPEC = wsym.detect(MLP, X)
SD, SD_OTHER = MLP.state_dict(), OTHER.state_dict()
CE, B = torch.nn.functional.cross_entropy, [(X, Y)]

CALLS = {
    "align without a spec": (lambda: wsym.align(SD, SD, None), "needs a SymmetrySpec"),
    "merge of one state dict": (lambda: wsym.merge(SD, SPEC), "needs a list of state dicts"),
    "interpolate another architecture": (
        lambda: wsym.interpolate(MLP, SD, SD_OTHER, B, CE),
        r"0.weight has shape \(6, 4\) in sd_a and \(5, 4\) in sd_b",
    ),
    "interpolate a number": (lambda: wsym.interpolate(42, SD, SD, B, CE), "got int"),
    "interpolate modules": (lambda: wsym.interpolate(MLP, MLP, MLP, B, CE), "sd_a"),
    "interpolate a tensor of batches": (
        lambda: wsym.interpolate(MLP, SD, SD, X, CE),
        r"list of \(inputs, targets\) pairs, got Tensor",
    ),
    "sharpness of a number": (lambda: wsym.sharpness(42, B, CE, spec=SPEC), "got int"),
    "sharpness of a state dict": (
        lambda: wsym.sharpness(SD, B, CE, spec=SPEC),
        r"torch.nn.Module, got OrderedDict \(a state dict\?\)",
    ),
    "sharpness with another spec": (
        lambda: wsym.sharpness(OTHER, B, CE, spec=SPEC),
        r"0.weight has shape \(5, 4\) in the state dict passed to wsym.sharpness",
    ),
    "sharpness of one pair": (
        lambda: wsym.sharpness(MLP, (X, Y), CE, spec=SPEC),
        "a list holding a Tensor",
    ),
    "sharpness on wrong inputs": (
        lambda: wsym.sharpness(MLP, [(torch.randn(3, 5), Y)], CE, spec=SPEC),
        "the model fails on the batches' inputs",
    ),
    "sharpness with a string spec": (
        lambda: wsym.sharpness(MLP, B, CE, spec="x"),
        "needs a SymmetrySpec, got str",
    ),
    "sharpness with a string loss": (lambda: wsym.sharpness(MLP, B, "ce"), "loss_fn as a callable"),
    "teleport a number": (lambda: wsym.teleport(42, SPEC, B, CE), "got int"),
    "teleport a state dict": (lambda: wsym.teleport(SD, SPEC, B, CE), "a state dict"),
    "teleport on a tensor": (lambda: wsym.teleport(MLP, SPEC, X, CE), "got Tensor"),
    "verify a number": (lambda: SPEC.verify(42, X), "SymmetrySpec.verify needs a torch.nn"),
    "verify on wrong inputs": (
        lambda: SPEC.verify(MLP, torch.randn(3, 5)),
        "the model fails on the example inputs in float64",
    ),
    "act with a number": (lambda: SPEC.act(42, SD), "needs a GroupElement, got int"),
    "act with None": (lambda: SPEC.act(None, SD), "needs a GroupElement, got NoneType"),
    "sample at a bad scale": (lambda: SPEC.sample(scale=5), r"scale must be a pair"),
    "conserved of another architecture": (
        lambda: SPEC.conserved(SD_OTHER),
        r"0.weight has shape \(5, 4\) in the state dict passed to SymmetrySpec.conserved",
    ),
    "conserved of a module": (lambda: SPEC.conserved(MLP), "needs a state dict"),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_entry_point_refuses_in_one_line(name):
    call, match = CALLS[name]
    with pytest.raises(WsymInputError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


def test_the_checks_leave_good_calls_alone():
    assert wsym.sharpness(MLP, B, CE, spec=SPEC, measure="euclidean", steps=2) >= 0
    curve = wsym.interpolate(MLP, SD, SD, B, CE, steps=3)
    assert len(curve.losses) == 3
