"""sort / topk: a permutation of the sorted axis leaves the sorted values unchanged."""

import pytest
import torch

import wsym
from wsym.errors import SymmetryWarning


class Sorted(torch.nn.Module):
    """A hidden layer read through a sort (or topk) in one of several ways."""

    def __init__(self, mode):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3), torch.nn.Linear(4, 6)
        self.mode = mode

    def forward(self, x):
        h = self.a(x)
        if self.mode == "values":
            return self.b(torch.sort(h, dim=-1).values)
        if self.mode == "descending":
            return self.b(torch.sort(h, dim=-1, descending=True, stable=True).values)
        if self.mode == "topk":
            return torch.topk(h, 3, dim=-1).values
        if self.mode == "over-batch":
            return self.b(torch.sort(h, dim=0).values)
        values, order = torch.sort(h, dim=-1)
        if self.mode == "indices":
            return self.b(values) + order.double()[..., :3]
        return self.b(torch.gather(self.c(x), -1, order))  # "gather"


def kinds(spec):
    return sorted(g.kind for g in spec.groups if "a.weight" in g.params)


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("values", ["permutation"]),
        ("descending", ["permutation"]),
        ("topk", ["permutation"]),
        ("over-batch", ["permutation", "scaling"]),  # sorting each feature over the batch
        ("indices", []),  # the order is read: a permutation moves it
        ("gather", []),
    ],
)
def test_sorted_axis_permutes_and_nothing_else(mode, expected):
    torch.manual_seed(0)
    model, x = Sorted(mode).double(), torch.randn(8, 4, dtype=torch.float64)
    if mode == "gather":
        with pytest.warns(SymmetryWarning, match="gather"):
            spec = wsym.detect(model, x)
    else:
        spec = wsym.detect(model, x)
    assert kinds(spec) == expected
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    moved = spec.act(spec.sample(seed=1), sd)  # the whole group at once
    for scale in (1.0, 50.0, 1000.0):
        before = torch.func.functional_call(model, sd, (scale * x,))
        after = torch.func.functional_call(model, moved, (scale * x,))
        assert float((after - before).abs().max()) <= 1e-12 * float(before.abs().max())
