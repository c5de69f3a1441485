"""The park predictor reuses a detected spec only where it verifies on the module at hand."""

import pytest
import torch

from wsym.metanet.park import ParkPredictor


class PlainActivation(torch.nn.Module):
    """An MLP whose activation is a plain attribute: ``repr`` does not show it."""

    def __init__(self, act):
        super().__init__()
        self.a, self.b = torch.nn.Linear(5, 7), torch.nn.Linear(7, 3)
        self.act = act

    def forward(self, x):
        return self.b(self.act(self.a(x)))


def _kinds(predictor, model):
    (schema,), _ = predictor._schemas((model, model.state_dict()), 0)
    return schema.spec.kinds()


@pytest.mark.parametrize("first, second", [(torch.relu, torch.tanh), (torch.tanh, torch.relu)])
def test_same_class_repr_and_tensors_other_activation_gets_its_own_spec(first, second):
    torch.manual_seed(0)
    one, other = PlainActivation(first), PlainActivation(second)
    assert repr(one) == repr(other)
    predictor = ParkPredictor(torch.nn.Identity(), {}, {}, example_inputs=torch.randn(4, 5))
    want = {torch.relu: "scaling", torch.tanh: "sign"}
    assert want[first] in _kinds(predictor, one)
    assert want[second] in _kinds(predictor, other)
    assert want[first] not in _kinds(predictor, other)
    assert want[first] in _kinds(predictor, PlainActivation(first))  # the first spec reused
    assert len(predictor.schemas) == 2
