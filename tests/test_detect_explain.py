"""``spec.explain(param)``: per axis, the groups acting and what blocked the others."""

import warnings

import pytest
import torch
from cases import DataDependentClamp
from torch import nn

import wsym
from wsym.group.spec import SymmetrySpec


def quiet_detect(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wsym.detect(model, x)


def test_explain_names_the_blocking_activation_and_the_model_boundary():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2))
    spec = quiet_detect(net, torch.randn(6, 3))
    text = spec.explain("2.weight")
    rows, cols = text.split("axis 1")
    assert "S_5 (permutation)" in rows and "(R+)^5 (scaling)" in rows
    assert "no GL or orthogonal maps: aten::relu (relu)" in rows
    assert "no scaling" not in rows and "no sign: aten::relu (relu) fixes the sign" in rows
    assert "S_4 (permutation)" in cols and "no scaling: aten::gelu (gelu) fixes the scale" in cols
    assert "no permutation or mixing: model input" in spec.explain("0.weight")
    assert "no permutation or mixing: model output" in spec.explain("4.bias")


class Cumulative(nn.Module):
    """An op without a rule (cumsum) between two layers blocks the hidden units."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.cumsum(torch.relu(self.a(x)), dim=-1))


def test_explain_names_an_unknown_operation():
    spec = quiet_detect(Cumulative(), torch.randn(6, 3))
    assert not any(g.kind == "permutation" for g in spec.groups)
    assert "operation aten::cumsum is not understood" in spec.explain("a.weight")


def test_explain_reports_a_candidate_refused_on_a_value_dependent_branch():
    # the clamp's branch is forced both ways (wsym/detect/guards.py): the scaling is proposed
    # on one path only, so it is refused before verification, and explain says why
    torch.manual_seed(0)
    spec = quiet_detect(DataDependentClamp(), torch.randn(6, 4))
    assert not any(g.kind == "scaling" for g in spec.groups), spec.table()
    text = spec.explain("a.weight")
    assert "(R+)^8 (scaling) conditional: not proposed on every branch" in text


def test_notes_survive_json_and_unknown_names_are_refused():
    spec = quiet_detect(Cumulative(), torch.randn(6, 3))
    again = SymmetrySpec.from_json(spec.to_json())
    assert again.notes == spec.notes and again.explain("b.weight") == spec.explain("b.weight")
    with pytest.raises(KeyError, match="not a parameter"):
        spec.explain("c.weight")
