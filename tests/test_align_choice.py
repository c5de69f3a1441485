"""continuous="auto": the candidates run, the lowest objective kept."""

import pytest
import torch

import wsym
from wsym.align.alignment import RECOVERY_ONLY, RECOVERY_ONLY_WITHOUT_DATA, REFINED
from wsym.align.choice import path_objective
from wsym.align.continuous import mismatch
from wsym.models.networks import MLP, CNN1d, ResidualCNN, TinyTransformer


def double(sd):
    return {k: v.detach().double() if v.is_floating_point() else v for k, v in sd.items()}


def relative(a, b):
    num = sum(float((a[k] - b[k]).pow(2).sum()) for k in a if a[k].is_floating_point())
    den = sum(float(a[k].pow(2).sum()) for k in a if a[k].is_floating_point())
    return (num / den) ** 0.5


def pair(make, seed_b=1):
    torch.manual_seed(0)
    a = make().double().eval()
    torch.manual_seed(seed_b)
    b = make().double().eval()
    return a, double(a.state_dict()), double(b.state_dict())


PAIRS = {
    "mlp": (lambda: MLP(6, [12, 12], 3), lambda g: torch.randn(32, 6, generator=g)),
    "bn-cnn": (lambda: CNN1d(channels=6), lambda g: torch.randn(32, 40, generator=g)),
    "transformer": (
        lambda: TinyTransformer(patch=4, seq=6, dim=8, heads=2, depth=1, hidden=12),
        lambda g: torch.randn(32, 6, 4, generator=g),
    ),
}


def data_pair(name):
    make, inputs = PAIRS[name]
    model, sd_a, sd_b = pair(make)
    gen = torch.Generator().manual_seed(0)
    x = inputs(gen).double()
    with torch.no_grad():
        classes = model(x).shape[-1]
    batches = [(x, torch.randint(0, classes, (32,), generator=gen))]
    return model, sd_a, sd_b, wsym.detect(model, x[:4]), batches


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_default_objective_is_never_above_a_candidate(name):
    """Without data: the weight objective, never above a reference start's or the options'."""
    model, sd_a, sd_b, spec, _ = data_pair(name)
    moved, report = wsym.align(sd_a, sd_b, spec, with_report=True)
    assert report.objective == "weights"
    assert {"identity", "canonical"} <= set(report.values)
    ranked = {k: v for k, v in report.values.items() if k not in RECOVERY_ONLY_WITHOUT_DATA}
    assert report.values[report.chosen] == min(ranked.values())
    value = mismatch(spec, sd_a, moved)
    assert value == pytest.approx(report.values[report.chosen], rel=1e-9)
    assert value <= mismatch(spec, sd_a, wsym.align(sd_a, sd_b, spec, continuous="reference")) * (
        1 + 1e-12
    )


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_default_with_data_keeps_the_lowest_path_loss(name):
    """With data: the path loss, never above any candidate's or any other method's.

    The candidates include the two lowest refined by the path fit (``"<name> + path"``);
    the other methods are compared unrefined.
    """
    model, sd_a, sd_b, spec, batches = data_pair(name)
    moved, report = wsym.align(sd_a, sd_b, spec, model=model, batches=batches, with_report=True)
    assert report.objective == "path"
    assert {"identity", "canonical", "canonical once", "activations"} <= set(report.values)
    refined = [k for k in report.values if k.endswith(" + path")]
    assert len(refined) == REFINED
    best = path_objective(model, sd_a, moved, batches)
    ranked = [v for k, v in report.values.items() if k not in RECOVERY_ONLY]
    assert best == pytest.approx(min(ranked), rel=1e-9)
    unrefined = wsym.align(sd_a, sd_b, spec, model=model, batches=batches, refine="none")
    assert best <= path_objective(model, sd_a, unrefined, batches) + 1e-12
    options = [("weights", c) for c in ("reference", "canonical", "canonical+reference")]
    options += [(m, "reference") for m in ("activations", "activations+weights")]
    for method, continuous in options:
        other = wsym.align(
            sd_a,
            sd_b,
            spec,
            method,
            continuous=continuous,
            model=model,
            batches=batches,
            refine="none",
        )
        assert best <= path_objective(model, sd_a, other, batches) + 1e-12


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_refine_none_keeps_the_unrefined_choice(name):
    """``refine="none"`` with data: the candidates' choice alone, no path fit."""
    model, sd_a, sd_b, spec, batches = data_pair(name)
    _, report = wsym.align(
        sd_a, sd_b, spec, model=model, batches=batches, refine="none", with_report=True
    )
    assert not any(k.endswith(" + path") for k in report.values)
    assert report.values[report.chosen] == min(
        v for k, v in report.values.items() if k not in RECOVERY_ONLY
    )


def test_refine_path_runs_on_a_batchnorm_cnn():
    model, sd_a, sd_b = pair(lambda: CNN1d(channels=6))
    x = torch.randn(32, 40, dtype=torch.float64)
    spec = wsym.detect(model, x[:4])
    batches = [(x, torch.randint(0, 10, (32,)))]
    moved = wsym.align(sd_a, sd_b, spec, refine="path", model=model, batches=batches)
    net = CNN1d(channels=6).double().eval()
    outs = []
    for sd in (sd_b, moved):
        net.load_state_dict(sd)
        with torch.no_grad():
            outs.append(net(x))
    assert float((outs[1] - outs[0]).abs().max() / outs[0].abs().max()) < 1e-9


class ConvNeXtNet(torch.nn.Module):
    """A stem, one timm ConvNeXt block, pooling and a head."""

    def __init__(self):
        super().__init__()
        from timm.models.convnext import ConvNeXtBlock

        self.stem = torch.nn.Conv2d(3, 8, 2, stride=2)
        self.block = ConvNeXtBlock(8, ls_init_value=0.5)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.block(self.stem(x)).mean((2, 3)))


def convnext():
    pytest.importorskip("timm")
    return ConvNeXtNet(), torch.randn(2, 3, 8, 8, dtype=torch.float64)


@pytest.mark.parametrize("name", ["residual-cnn", "convnext"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_recovers_a_planted_element(name, seed):
    torch.manual_seed(0)
    if name == "convnext":
        model, x = convnext()
    else:
        model, x = ResidualCNN(channels=6), torch.randn(2, 1, 8, 8, dtype=torch.float64)
    model = model.double().eval()
    spec = wsym.detect(model, x)
    sd = double(model.state_dict())
    moved = spec.act(spec.sample(seed=seed, scale=(0.1, 10.0)), sd)
    assert relative(sd, moved) > 1e-2
    for continuous in ("reference", "auto"):  # the default and the chosen alignment
        assert relative(sd, wsym.align(sd, moved, spec, continuous=continuous)) < 1e-8


class Fire(torch.nn.Module):
    """SqueezeNet's Fire module: a 1x1 squeeze read by a 1x1 and a 3x3 expand, concatenated."""

    def __init__(self, cin, squeeze, expand):
        super().__init__()
        self.squeeze = torch.nn.Conv2d(cin, squeeze, 1)
        self.e1 = torch.nn.Conv2d(squeeze, expand, 1)
        self.e3 = torch.nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x):
        x = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.e1(x)), torch.relu(self.e3(x))], 1)


def squeezenet(depth=4):
    """A narrow SqueezeNet (squeeze 2, expand 8), torchvision's initialization."""
    layers = [torch.nn.Conv2d(3, 12, 3), torch.nn.ReLU(), Fire(12, 2, 8)]
    layers += [Fire(16, 2, 8) for _ in range(depth - 1)]
    layers += [torch.nn.Conv2d(16, 5, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()]
    net = torch.nn.Sequential(*layers)
    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):
            torch.nn.init.kaiming_uniform_(m.weight)
            torch.nn.init.zeros_(m.bias)
    return net


@pytest.mark.parametrize("kinds", [["permutation"]])
def test_default_recovers_a_planted_element_where_matching_stalls(kinds):
    """Not a chain of layers: from the identity or the canonical start, weight matching stalls."""
    torch.manual_seed(0)
    model = squeezenet().double().eval()
    spec = wsym.detect(model, torch.randn(2, 3, 8, 8, dtype=torch.float64))
    sd = double(model.state_dict())
    g = spec.sample(seed=0, kinds=kinds) if kinds else spec.sample(seed=0, scale=(0.1, 10.0))
    moved = spec.act(g, sd)
    back, report = wsym.align(sd, moved, spec, with_report=True)
    assert relative(sd, back) < 1e-8
    assert report.chosen == "signature"
