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


class ReadsANumber(torch.nn.Module):
    """FarBranch's branch on a value read into Python: ``.item()``, ``float()``, ``.tolist()``."""

    def __init__(self, read):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 2)
        self.read = read

    def forward(self, x):
        z = self.a(x)
        big = x.abs().max()
        value = {"item": big.item, "float": lambda: float(big), "tolist": big.tolist}[self.read]()
        return self.b(torch.relu(z) if value < 1e4 else torch.tanh(z))


@pytest.mark.parametrize("read", ["item", "float", "tolist"])
def test_a_value_read_as_a_number_refuses_every_group(read):
    torch.manual_seed(0)
    with pytest.warns(SymmetryWarning, match="conditional"):
        spec = wsym.detect(ReadsANumber(read).double(), torch.randn(5, 64, dtype=torch.float64))
    assert spec.groups == ()  # main kept the scaling of one branch: 27.8 off at 1e5
    assert any("into Python as a number" in note[2] for note in spec.notes)


class CountsTokens(torch.nn.Module):
    """A number read from integer inputs alone (a length) branches nothing a group moves."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(10, 6), torch.nn.Linear(6, 2)

    def forward(self, ids):
        n = int((ids > 0).sum())
        return self.head(torch.relu(self.embed(ids[:, : max(n, 1)]))).mean(1)


def test_a_number_read_from_integer_inputs_keeps_the_groups():
    spec = wsym.detect(CountsTokens(), torch.randint(0, 10, (2, 5)))
    assert spec.kinds().get("permutation") == 1
