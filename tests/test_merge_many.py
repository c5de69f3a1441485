"""MergeMany: several checkpoints aligned to a common basis; bad input refused in one line."""

import pytest
import torch
from test_canon import double

import wsym
from wsym.errors import WsymInputError
from wsym.models.networks import MLP


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    net = MLP(5, [8, 6], 3).double()
    return net, wsym.detect(net, torch.randn(2, 5, dtype=torch.float64))


def members(n):
    out = []
    for seed in range(n):
        torch.manual_seed(10 + seed)
        out.append(double(MLP(5, [8, 6], 3).state_dict()))
    return out


def test_merge_many_of_moved_copies_is_the_model(mlp):
    net, spec = mlp
    sd = double(net.state_dict())
    copies = [sd] + [spec.act(spec.sample(seed=s, scale=(0.5, 2.0)), sd) for s in (1, 2, 3)]
    # raw weight matching (the default) need not undo per-unit rescalings by 2x exactly
    merged, report = wsym.merge(copies, spec, continuous="canonical+reference", with_report=True)
    assert max(float((merged[k] - sd[k]).abs().max()) for k in sd) < 1e-8
    assert len(report.aligned) == 4


def test_merge_many_never_raises_the_spread_and_reports_barriers(mlp):
    net, spec = mlp
    sds = members(4)
    batches = [(torch.randn(32, 5, dtype=torch.float64), torch.randint(0, 3, (32,)))]
    lf = torch.nn.functional.cross_entropy
    _, report = wsym.merge(
        sds, spec, model=net, batches=batches, loss_fn=lf, with_report=True, rounds=3
    )
    spread = report.mismatch
    assert all(b <= a for a, b in zip(spread, spread[1:], strict=False))
    assert len(report.barriers) == 4 and all(b >= 0 for b in report.barriers)
    x = batches[0][0]
    for original, moved in zip(sds, report.aligned, strict=True):  # each keeps its function
        net.load_state_dict(original)
        before = net(x)
        net.load_state_dict(moved)
        assert torch.allclose(net(x), before, rtol=1e-9, atol=1e-12)


def test_merge_refuses_nan_and_mismatched_shapes_naming_the_tensor(mlp):
    _, spec = mlp
    a, b = members(2)
    bad = {**b, "2.weight": b["2.weight"].clone()}
    bad["2.weight"][0, 0] = float("nan")
    with pytest.raises(WsymInputError, match=r"2\.weight holds NaN"):
        wsym.merge([a, b, bad], spec)
    wrong = {**b, "0.bias": torch.zeros(9, dtype=torch.float64)}
    with pytest.raises(WsymInputError, match=r"0\.bias has shape \(9,\) in checkpoint 2"):
        wsym.merge([a, wrong], spec)
