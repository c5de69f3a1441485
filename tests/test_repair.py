"""REPAIR: planted activation statistics are restored exactly; flags of interpolate and merge."""

import copy

import pytest
import torch
from test_canon import double

import wsym
from wsym.align.batchnorm import reset_batchnorm_stats
from wsym.align.repair import Repair, correction_points, unit_statistics
from wsym.errors import WsymInputError
from wsym.models.networks import MLP, CNN1d, TinyTransformer


def batches(shape, n=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=gen, dtype=torch.float64), None) for _ in range(n)]


def planted(sd, key, scale, shift):
    """``sd`` with the unit outputs of layer ``key`` mapped by ``scale z + shift``."""
    out = dict(sd)
    out[f"{key}.weight"] = sd[f"{key}.weight"] * scale.reshape(
        -1, *[1] * (sd[f"{key}.weight"].ndim - 1)
    )
    out[f"{key}.bias"] = sd[f"{key}.bias"] * scale + shift
    return out


def test_repair_restores_a_planted_scale_and_shift_exactly():
    torch.manual_seed(0)
    net = MLP(5, [7, 6], 3).double()
    sd = double(net.state_dict())
    data = batches((64, 5))
    gen = torch.Generator().manual_seed(1)
    scale = torch.rand(7, generator=gen, dtype=torch.float64) * 2 + 0.2
    shift = torch.randn(7, generator=gen, dtype=torch.float64)
    broken = planted(sd, "0", scale, shift)
    names = correction_points(net, data[0][0])
    assert names == ["0", "2"]  # the head (model output) is left alone
    fixed = Repair(net, [sd, sd], data)(broken, [0.5, 0.5])
    for k in sd:
        assert torch.allclose(fixed[k], sd[k], rtol=1e-10, atol=1e-12), k
    target = unit_statistics(net, sd, data, ["0"])["0"]
    got = unit_statistics(net, fixed, data, ["0"])["0"]
    assert torch.allclose(got[1], target[1], rtol=1e-12) and torch.allclose(got[0], target[0])


def test_repair_sets_the_interpolated_statistics_of_two_endpoints():
    torch.manual_seed(0)
    net = MLP(5, [7], 3).double()
    sd_a = double(net.state_dict())
    gen = torch.Generator().manual_seed(2)
    sd_b = planted(
        sd_a,
        "0",
        torch.rand(7, generator=gen, dtype=torch.float64) + 0.5,
        torch.randn(7, generator=gen, dtype=torch.float64),
    )
    data = batches((64, 5))
    merged = {k: (sd_a[k] + sd_b[k]) / 2 for k in sd_a}
    merged = planted(
        merged, "0", torch.full((7,), 0.1, dtype=torch.float64), torch.zeros(7, dtype=torch.float64)
    )
    fixed = Repair(net, [sd_a, sd_b], data)(merged, [0.25, 0.75])
    stats = [unit_statistics(net, sd, data, ["0"])["0"] for sd in (sd_a, sd_b, fixed)]
    for i in range(2):
        assert torch.allclose(stats[2][i], 0.25 * stats[0][i] + 0.75 * stats[1][i], rtol=1e-10)


def test_repair_corrects_layernorm_outputs_through_their_gain_and_bias():
    torch.manual_seed(0)
    net = TinyTransformer(patch=4, seq=6, dim=8, heads=2, depth=1, hidden=12).double()
    sd = double(net.state_dict())
    data = batches((16, 6, 4))
    names = correction_points(net, data[0][0])
    assert "blocks.0.norm1" in names and "norm" in names and "head" not in names
    broken = dict(sd)
    broken["norm.weight"] = sd["norm.weight"] * 3.0
    broken["norm.bias"] = sd["norm.bias"] - 1.0
    fixed = Repair(net, [sd, sd], data)(broken, [0.5, 0.5])
    assert torch.allclose(fixed["norm.weight"], sd["norm.weight"], rtol=1e-10)
    assert torch.allclose(fixed["norm.bias"], sd["norm.bias"], atol=1e-10)


def test_repair_resets_batchnorm_statistics_and_skips_the_layers_feeding_them():
    torch.manual_seed(0)
    net = CNN1d(channels=4)
    data = [(torch.randn(32, 40), None) for _ in range(3)]
    assert correction_points(copy.deepcopy(net).double(), data[0][0].double()) == []
    sd = net.state_dict()
    stale = {**sd, "bn1.running_var": sd["bn1.running_var"] * 50}
    fixed = Repair(net, [sd, sd], data)(stale, [0.5, 0.5])
    assert not torch.allclose(fixed["bn1.running_var"], stale["bn1.running_var"])
    again = reset_batchnorm_stats(net, stale, data)
    assert torch.allclose(fixed["bn1.running_var"], again["bn1.running_var"], rtol=1e-5)


def test_interpolate_and_merge_take_repair_as_one_flag():
    torch.manual_seed(0)
    net = MLP(5, [9], 3).double()
    spec = wsym.detect(net, torch.randn(2, 5, dtype=torch.float64))
    sd = double(net.state_dict())
    data = [(x, torch.randint(0, 3, (64,))) for x, _ in batches((64, 5))]
    other = double(MLP(5, [9], 3).state_dict())  # independently initialized
    lf = torch.nn.functional.cross_entropy
    curve = wsym.interpolate(net, sd, sd, data, lf, steps=3, repair=True)
    assert curve.barrier == pytest.approx(0.0, abs=1e-12)
    merged = wsym.merge([sd, other], spec, model=net, batches=data, repair=True)
    plain = wsym.merge([sd, other], spec)
    assert not torch.allclose(merged["0.weight"], plain["0.weight"])
    with pytest.raises(WsymInputError, match="repair needs model= and batches="):
        wsym.merge([sd, other], spec, repair=True)
