"""Detection's group testing: float64 on fresh inputs, float32 on the regime probes.

The regime probes (x20, x1/20) catch what moves outputs by orders of magnitude;
the float64 probe catches the small breaks (an ``eps`` no input scale hides).
Each half is shown to be needed: the false claim each catches passes the other.
"""

import torch
from test_detect_activations import Act, _fake_scaling
from torch import nn

import wsym
from wsym.group.elements import act, sample
from wsym.group.floor import FACTOR, relative
from wsym.group.verify import float64_probe, probes, screen


def _passes(probe, spec, groups) -> bool:
    """Whether one element of ``groups`` stays within ``probe``'s own calibrated tolerance."""
    base = probe.generic
    g = sample(spec, seed=3, scale=(0.1, 10.0), groups=groups, moving=True)
    return relative(probe(act(spec, g, base)), probe.reference(base)) <= FACTOR * probe.floor(base)


def test_regime_probes_compute_in_float32_and_fresh_inputs_in_float64():
    model = Act(nn.ReLU())
    kinds = [p.dtype for p in probes(float64_probe(model, torch.randn(5, 4)), torch.float32)]
    assert kinds == [torch.float64, torch.float32, torch.float32]
    assert [p.dtype for p in probes(float64_probe(model, torch.randn(5, 4)))] == [torch.float64] * 3


def test_small_break_is_caught_in_float64_where_float32_cannot_see_it():
    """A BatchNorm eps the spec's correction does not know: outputs move by ~1e-6."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)).eval()
    x = torch.randn(8, 4)
    spec = wsym.detect(model, x)
    ns = [i for i, g in enumerate(spec.groups) if g.kind == "norm_scaling"]
    assert ns
    model[1].eps *= 1.5  # the recorded corrections are now slightly wrong
    fresh, *regimes = probes(float64_probe(model, x), torch.float32)
    assert all(_passes(p, spec, ns) for p in regimes)  # float32 alone would keep it
    assert not _passes(fresh, spec, ns)
    _, failed = screen(spec, float64_probe(model, x))
    assert set(ns) <= set(failed)


def test_saturation_break_is_caught_by_the_float32_regime_probe():
    """ReLU6 is linear on tiny inputs: a false scaling shows only at x20, grossly."""
    torch.manual_seed(0)
    model = Act(nn.ReLU6()).double()
    x = 1e-3 * torch.randn(5, 4, dtype=torch.float64)
    spec = wsym.detect(model, x)
    perm = next(g for g in spec.groups if g.kind == "permutation")
    fake = _fake_scaling(spec, perm.cls, ["a.weight", "a.bias", "b.weight"])
    probe = float64_probe(model, x)
    fresh, saturating, linear = probes(probe, torch.float32)
    assert _passes(fresh, fake, [0]) and _passes(linear, fake, [0])
    assert not _passes(saturating, fake, [0])
    _, failed = screen(fake, probe)
    assert failed == [0]


def test_islands_find_a_float32_island_and_nothing_else():
    """A down-cast is an island; ops on lists of float64 tensors (``cat``) are not."""
    from wsym.group.floor import Islands

    x = torch.randn(3, 4, dtype=torch.float64)
    with Islands() as clean:
        torch.cat([x, x]).sum()
    with Islands() as island:
        torch.cat([x.float(), x.float()]).double().sum()
    assert clean.eps == torch.finfo(torch.float64).eps
    assert island.eps == torch.finfo(torch.float32).eps
    gen = torch.Generator().manual_seed(0)
    with Islands(perturb=True, gen=gen):  # an island's output moves by about one float32 ulp
        y = x.float().double()
    assert 0 < float((y - x.float().double()).abs().max()) < 1e-6


def test_one_float32_floor_serves_both_regime_probes_and_false_claims_still_fail(monkeypatch):
    """The x1/20 probe reuses the x20 probe's float32 floor: one floor per dtype.

    Sharing it can only lower a tolerance; the false claims each probe catches
    (ReLU6's cap at x20, an unscaled bias in the linear region at x1/20, a
    BatchNorm eps in float64) are still rejected, and true groups still pass.
    """
    from wsym.group.verify import Probe

    measured = []
    floor = Probe.floor
    monkeypatch.setattr(
        Probe, "floor", lambda p, st: measured.append((p.dtype, p.input_scale)) or floor(p, st)
    )
    torch.manual_seed(0)
    model = Act(nn.ReLU6()).double()
    x = 1e-3 * torch.randn(5, 4, dtype=torch.float64)
    spec = wsym.detect(model, x)
    assert spec.groups  # the true permutation passes
    perm = next(g for g in spec.groups if g.kind == "permutation")
    measured.clear()
    _, failed = screen(
        _fake_scaling(spec, perm.cls, ["a.weight", "a.bias", "b.weight"]), float64_probe(model, x)
    )
    assert failed == [0]
    assert (torch.float32, 0.05) not in measured  # the x1/20 probe measures none of its own
    assert measured.count((torch.float32, 20.0)) <= 1
    # a bias left unscaled: visible where biases dominate, the linear region (x1/20)
    relu = Act(nn.ReLU()).double()
    spec = wsym.detect(relu, x)
    perm = next(g for g in spec.groups if g.kind == "permutation")
    unscaled_bias = _fake_scaling(spec, perm.cls, ["a.weight", "b.weight"])
    fresh, saturating, linear = probes(float64_probe(relu, x), torch.float32)
    assert not _passes(linear, unscaled_bias, [0])
    _, failed = screen(unscaled_bias, float64_probe(relu, x))
    assert failed == [0]


def test_a_floor_is_measured_only_where_a_deviation_needs_it(monkeypatch):
    """True groups move outputs by about ``eps``: no floor's forward pass is run.

    A deviation within ``FACTOR * eps`` passes whatever the floor (never below
    ``eps``), so the decisions are the measured floor's; the BatchNorm eps break
    (~1e-6 in float64) needs the float64 floor, and is rejected.
    """
    from wsym.group.verify import Probe

    measured = []
    floor = Probe.floor
    monkeypatch.setattr(Probe, "floor", lambda p, st: measured.append(p.dtype) or floor(p, st))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)).eval()
    x = torch.randn(8, 4)
    spec = wsym.detect(model, x)
    assert {g.kind for g in spec.groups} >= {"permutation", "norm_scaling"}
    measured.clear()
    devs, failed = screen(spec, float64_probe(model, x))
    assert failed == [] and measured == []
    model[1].eps *= 1.5
    _, failed = screen(spec, float64_probe(model, x))
    assert failed and torch.float64 in measured
