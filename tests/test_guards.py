"""Value-dependent branches: groups must hold on every branch a guard can take."""

import pytest
import torch

import wsym
from wsym.detect.guards import MAX_PATHS, ForcedGuards, paths
from wsym.detect.tracing.record import record
from wsym.errors import SymmetryWarning


class FarBranch(torch.nn.Module):
    """ReLU below a large input scale, tanh above it: scaling holds on the first branch only."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 2)

    def forward(self, x):
        z = self.a(x)
        if x.abs().max() < 1e4:
            return self.b(torch.relu(z))
        return self.b(torch.tanh(z))


class SameBothWays(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)

    def forward(self, x):
        h = torch.relu(self.a(x))
        return self.b(h) if h.sum() > 0 else -self.b(h)


class Looping(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)

    def forward(self, x):
        for _ in range(MAX_PATHS):
            if x.sum() > 1e6:
                x = x / 2
        return self.b(torch.relu(self.a(x)))


def _moved(model, spec, x, seed):
    other = FarBranch().double()
    other.load_state_dict(spec.act(spec.sample(seed=seed), model.state_dict()))
    with torch.no_grad():
        return float((other(x) - model(x)).abs().max() / model(x).abs().max())


def test_a_group_of_one_branch_only_is_refused_and_the_rest_holds_on_far_inputs():
    torch.manual_seed(0)
    model = FarBranch().double()
    with pytest.warns(SymmetryWarning, match="refused conditional scaling"):
        spec = wsym.detect(model, torch.randn(5, 64, dtype=torch.float64))
    assert spec.kinds() == {"permutation": 1}  # main reported scaling too (27.8 at 1e5)
    assert any("conditional" in note[2] for note in spec.notes)
    x = 1e5 * torch.randn(50, 64, dtype=torch.float64)
    assert max(_moved(model, spec, x, seed) for seed in range(3)) < 1e-9


def test_groups_common_to_both_branches_are_kept():
    spec = wsym.detect(SameBothWays(), torch.randn(3, 4))
    assert spec.kinds() == {"permutation": 1, "scaling": 1}


def test_forced_guards_take_the_other_branch():
    model = FarBranch().eval()
    traced = record(model, (torch.randn(2, 64),), {})
    assert traced.guards == ((0, True),)
    with ForcedGuards({0: False}):
        other = record(model, (torch.randn(2, 64),), {})
    names = {n.target._schema.name for n in other.graph.nodes if n.op == "call_function"}
    assert "aten::tanh" in names and "aten::relu" not in names
    assert len(paths(model, torch.randn(2, 64), traced.guards)) == 2


def test_too_many_paths_refuse_every_group():
    with pytest.warns(SymmetryWarning, match="conditional"):
        spec = wsym.detect(Looping(), torch.randn(2, 4))
    assert spec.groups == ()
    assert any("conditional" in note[2] for note in spec.notes)
