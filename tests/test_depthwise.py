"""The probe's float64 depthwise path: the kernel's values to round-off, used by every pass."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import wsym
from wsym.group import depthwise
from wsym.group.depthwise import ShiftedDepthwise, has_depthwise
from wsym.group.verify import Probe

ROUND_OFF = 1e-14  # relative; a sum of at most 49 products in another order


@settings(max_examples=60, deadline=None)
@given(
    channels=st.integers(1, 6),
    multiplier=st.integers(1, 3),
    size=st.tuples(st.integers(1, 9), st.integers(1, 9)),
    kernel=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    padding=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_shifted_depthwise_equals_the_kernel_in_float64(
    channels, multiplier, size, kernel, stride, dilation, padding, bias, seed
):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, channels, *size, generator=gen, dtype=torch.float64)
    w = torch.randn(channels * multiplier, 1, *kernel, generator=gen, dtype=torch.float64)
    b = torch.randn(channels * multiplier, generator=gen, dtype=torch.float64) if bias else None
    args = {"stride": stride, "padding": padding, "dilation": dilation, "groups": channels}
    try:
        ref = F.conv2d(x, w, b, **args)
    except RuntimeError:  # kernel larger than the padded input: nothing to compare
        return
    with ShiftedDepthwise():
        out = F.conv2d(x, w, b, **args)
    assert out.shape == ref.shape and out.is_contiguous()
    scale = ref.abs().max().clamp_min(1e-300)
    assert float((out - ref).abs().max() / scale) <= ROUND_OFF


@pytest.mark.parametrize(
    "conv, dtype",
    [
        (nn.Conv2d(4, 4, 3, padding=1, groups=4), torch.float32),  # float32: the kernel is fast
        (nn.Conv2d(4, 6, 3, padding=1, groups=2), torch.float64),  # two channels per group
        (nn.ConvTranspose2d(4, 4, 3, groups=4), torch.float64),
        (nn.Conv1d(4, 4, 3, groups=4), torch.float64),
    ],
)
def test_other_convolutions_run_the_kernel_unchanged(conv, dtype, monkeypatch):
    conv = conv.to(dtype)
    x = torch.randn(2, 4, *(7,) * (conv.weight.ndim - 2), dtype=dtype)
    monkeypatch.setattr(depthwise, "shifted_depthwise", _refuse)
    with torch.no_grad(), ShiftedDepthwise():
        out = conv(x)
    with torch.no_grad():
        assert torch.equal(out, conv(x))


def _refuse(*args):
    raise AssertionError("the shifted path ran where the kernel should have")


def _mbconv():
    """A MobileNet-style block: expand, depthwise, project (with BatchNorms)."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 12, 1),
        nn.BatchNorm2d(12),
        nn.ReLU(),
        nn.Conv2d(12, 12, 3, padding=1, stride=2, groups=12),
        nn.BatchNorm2d(12),
        nn.ReLU(),
        nn.Conv2d(12, 5, 1),
    ).eval()


def test_every_float64_probe_pass_takes_the_shifted_path(monkeypatch):
    model = _mbconv()
    assert has_depthwise(model) and not has_depthwise(nn.Conv2d(4, 6, 3, groups=2))
    calls = []
    original = depthwise.shifted_depthwise
    monkeypatch.setattr(depthwise, "shifted_depthwise", lambda *a: calls.append(1) or original(*a))
    probe = Probe(model, torch.randn(2, 3, 8, 8))
    y = probe.reference(probe.generic)
    floor = probe.floor(probe.generic)  # the floor's perturbed pass too
    assert len(calls) == 2 and floor < 1e-13
    with torch.no_grad():  # the same outputs as the kernel's, to round-off
        ref = torch.func.functional_call(model, probe.generic, probe.args).reshape(-1)
    assert float((y - ref).abs().max() / ref.abs().max()) <= ROUND_OFF
    probe.in_dtype(torch.float32)(probe.generic)
    assert len(calls) == 2  # float32 passes run the kernel


def test_detection_through_the_shifted_path_finds_and_verifies_the_block_groups():
    model = _mbconv()
    spec = wsym.detect(model, torch.randn(2, 3, 8, 8))
    table = sorted((g.kind, g.notation) for g in spec.groups)
    assert table == [
        ("norm_scaling", "(R+)^12"),
        ("norm_scaling", "(R+)^12"),
        ("permutation", "S_12"),  # the depthwise channels move with the expanded ones
        ("scaling", "(R+)^12"),
        ("scaling", "(R+)^12"),
        ("sign", "Z2^12"),
        ("sign", "Z2^12"),
    ]
    assert max(spec.deviations) < 1e-12
    assert spec.verify(model, torch.randn(2, 3, 8, 8)).ok
