"""The activation tables, checked against each function's definition at saturating inputs."""

import pytest
import torch
from torch import nn

import wsym
from wsym.detect.rules.activation import claims
from wsym.group.spec import Group, SymmetrySpec, leaves

# inputs spanning every regime: tails (x20: tanh, relu6's cap), the linear region (x1/20)
X = torch.cat([torch.randn(64, dtype=torch.float64) * f for f in (1.0, 20.0, 0.05)])
DOMAIN = {"aten::atanh": 0.99, "aten::asin": 0.99, "aten::erfinv": 0.99, "aten::tan": 1.2}


def aten(name):
    return getattr(torch.ops.aten, name.split("::")[1])


def holds(name, kind, x=X) -> bool:
    """Whether ``aten::name`` really is homogeneous / odd on ``x`` (numerically, float64)."""
    f = aten(name)
    if name in DOMAIN:
        x = x.clamp(-DOMAIN[name], DOMAIN[name]) / (20.0 if kind == "homogeneous" else 1.0)
    if kind == "homogeneous":
        s = torch.tensor([0.1, 3.0, 17.0], dtype=torch.float64)
        return all(torch.allclose(f(si * x), si * f(x), rtol=1e-12, atol=1e-12) for si in s)
    return torch.allclose(f(-x), -f(x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", [n for n, k in claims().items() if k != "generic"])
def test_every_claimed_activation_holds_at_saturating_inputs(name):
    assert holds(name, claims()[name])


@pytest.mark.parametrize(
    "name, kind",
    [
        ("aten::relu6", "homogeneous"),  # the entry that was wrong: caps at 6
        ("aten::hardtanh", "homogeneous"),
        ("aten::gelu", "homogeneous"),
        ("aten::sigmoid", "odd"),
        ("aten::softplus", "homogeneous"),
    ],
)
def test_a_wrong_entry_would_be_caught(name, kind):
    """Negative control: the check above fails for functions that are not homogeneous / odd."""
    assert not holds(name, kind)


def test_in_place_and_out_of_place_forms_read_alike():
    for name in claims():
        assert f"{name}_" not in claims(), "in-place forms are read through their base op"


class Act(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.a, self.act, self.b = nn.Linear(4, 6), act, nn.Linear(6, 2)

    def forward(self, x):
        return self.b(self.act(self.a(x)))


@pytest.mark.parametrize(
    "act, expected",
    [
        (nn.ReLU6(inplace=True), {"permutation": 1}),
        (nn.ReLU6(), {"permutation": 1}),
        (nn.Hardtanh(0.0, 6.0, inplace=True), {"permutation": 1}),
        (nn.Hardtanh(), {"permutation": 1, "sign": 1}),  # (-1, 1): odd
        (nn.Hardtanh(-2.0, 3.0), {"permutation": 1}),
        (lambda h: h.clamp(min=0), {"permutation": 1, "scaling": 1}),
        (lambda h: h.clamp(-2, 2), {"permutation": 1, "sign": 1}),
        (lambda h: h.clamp(0, 6), {"permutation": 1}),
        (lambda h: torch.clamp_min(h, 0), {"permutation": 1, "scaling": 1}),
        (lambda h: torch.div(h, 0.5, rounding_mode="floor"), {"permutation": 1}),
        # zeros made in forward are recorded as zeros: this is ReLU
        (lambda h: torch.maximum(h, torch.zeros(())), {"permutation": 1, "scaling": 1}),
        (nn.GLU(), None),
    ],
)
def test_bounded_activations_get_exact_tables(act, expected):
    model = Act(act)
    if isinstance(act, nn.GLU):
        model.b = nn.Linear(3, 2)
        expected = {"permutation": 1}
    spec = wsym.detect(model, torch.randn(5, 4))
    assert spec.kinds() == expected, spec.table()


def _fake_scaling(spec: SymmetrySpec, cls: int, params) -> SymmetrySpec:
    """A false claim: scale class ``cls`` in and out as if the activation were homogeneous."""
    exps = []
    for _, dims in spec.layouts:
        for t in dims:
            for leaf in leaves(t):
                if leaf.cls == cls:
                    exps.append((leaf.var, 1 if leaf.parity == 0 else -1))
    size = next(g.size for g in spec.groups if g.cls == cls)
    group = Group("scaling", size, 1, tuple(params), cls=cls, exponents=tuple(exps))
    return SymmetrySpec(groups=(group,), layouts=spec.layouts)


def test_false_relu6_scaling_is_rejected_even_where_examples_never_saturate():
    """ReLU6 is linear on tiny inputs; the x20 probe pushes it into its cap."""
    torch.manual_seed(0)
    model = Act(nn.ReLU6()).double()
    spec = wsym.detect(model, 1e-3 * torch.randn(5, 4, dtype=torch.float64))
    perm = next(g for g in spec.groups if g.kind == "permutation")
    fake = _fake_scaling(spec, perm.cls, ["a.weight", "a.bias", "b.weight"])
    report = fake.verify(model, 1e-3 * torch.randn(5, 4, dtype=torch.float64))
    assert report.failed == [0]
    assert report.deviations[0] > 1e3 * report.floor


def test_tolerance_is_calibrated_to_the_models_floor():
    torch.manual_seed(0)
    model = Act(nn.ReLU())
    report = wsym.detect(model, torch.randn(5, 4)).verify(model, torch.randn(5, 4))
    assert report.ok and 1e-17 < report.floor < 1e-13
    assert report.tolerance == pytest.approx(1e3 * report.floor)


def test_adversarial_search_pushes_towards_a_counterexample():
    """Where a false claim barely shows, gradient ascent on the inputs makes it show more."""
    from wsym.group.adversary import adversarial_inputs
    from wsym.group.verify import Probe, deviation

    torch.manual_seed(0)
    model = Act(nn.Hardtanh(-3.0, 3.0))  # odd, not homogeneous: a scaling claim is false
    spec = wsym.detect(model, torch.randn(5, 4))
    perm = next(g for g in spec.groups if g.kind == "permutation")
    fake = _fake_scaling(spec, perm.cls, ["a.weight", "a.bias", "b.weight"])
    probe = Probe(model, torch.randn(5, 4), input_scale=3.0)  # a few units reach the cap
    before = deviation(probe, fake, [0], seed=1, scale=(0.5, 2.0), state=probe.generic)
    args, kwargs = adversarial_inputs(probe, fake, [0], seed=1, scale=(0.5, 2.0), steps=3)
    after = deviation(
        probe.with_inputs(args, kwargs), fake, [0], seed=1, scale=(0.5, 2.0), state=probe.generic
    )
    assert 1e-3 < before and after > 2 * before  # 0.19 -> 0.59
