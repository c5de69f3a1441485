"""A symmetry that does not hold must never be reported, nor survive verification."""

import copy
import warnings

import pytest
import torch
from cases import DataDependentClamp
from torch import nn

import wsym
from wsym.errors import SymmetryWarning, WsymInputError
from wsym.group.spec import Group, SymmetrySpec, leaves
from wsym.group.verify import Probe, deviation
from wsym.models.networks import MLP


def test_wrong_scaling_claim_is_caught_by_verify():
    torch.manual_seed(0)
    relu, gelu = MLP(6, [5], 3, "relu"), MLP(6, [5], 3, "gelu")
    gelu.load_state_dict(relu.state_dict())
    spec = wsym.detect(relu, torch.randn(4, 6))
    report = spec.verify(gelu, torch.randn(4, 6))
    scaling = [i for i, g in enumerate(spec.groups) if g.kind == "scaling"]
    assert scaling and all(report.deviations[i] > 1e-3 for i in scaling)
    perm = [i for i, g in enumerate(spec.groups) if g.kind == "permutation"]
    assert all(report.deviations[i] < 1e-12 for i in perm)


def test_false_group_hidden_behind_tiny_layer_scale_is_caught():
    """A 1e-12 layer-scale hides the attention branch at the model's weights, not at generic."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    vit = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, depth=1, init_values=1e-12, img_size=32
    )
    x = torch.randn(1, 3, 32, 32)
    spec = wsym.detect(vit, x)
    qk = next(g for g in spec.groups if g.kind == "gl")
    # a false claim: scale query AND key rows by s (the scores change by s**2)
    qk_vars = sorted(
        {
            leaf.var
            for _, dims in spec.layouts
            for t in dims
            for leaf in leaves(t)
            if leaf.cls == qk.cls
        }
    )
    false = Group(
        "scaling", qk.size, 1, qk.params, cls=qk.cls, exponents=tuple((v, 1) for v in qk_vars)
    )
    fake = SymmetrySpec(groups=(false,), layouts=spec.layouts)
    probe = Probe(vit, x)
    assert (
        deviation(probe, fake, [0], seed=0, state=probe.state) < 1e-9
    )  # hidden at the actual weights
    assert fake.verify(vit, x).deviations[0] > 1e-3  # caught at generic weights


def test_dead_branch_does_not_create_symmetries():
    class Dead(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 2)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return self.b(h + 0.0 * nn.functional.gelu(h))

    spec = wsym.detect(Dead(), torch.randn(3, 4))
    assert spec.kinds() == {"permutation": 1}


def test_outputs_and_inputs_block_their_axes():
    mlp = MLP(4, [5], 3)
    hidden_out = nn.Sequential(*list(mlp)[:2])  # the hidden layer is the output
    assert wsym.detect(hidden_out, torch.randn(2, 4)).groups == ()


def test_unknown_operation_blocks_and_warns():
    class RunningMax(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 5), nn.Linear(5, 2)

        def forward(self, x):
            return self.b(torch.cummax(self.a(x), dim=-1).values)

    with pytest.warns(SymmetryWarning, match="cummax"):
        spec = wsym.detect(RunningMax(), torch.randn(3, 4))
    assert spec.groups == ()


def test_layer_norm_eps_blocks_input_rescaling():
    """LayerNorm(s x) != LayerNorm(x) when eps > 0: no scaling of its input is claimed."""
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 2))
    spec = wsym.detect(model, torch.randn(3, 4))
    kinds = {g.kind: g for g in spec.groups}
    # detection is not empty: the LayerNorm's units permute, its gains scale its output
    assert kinds["permutation"].size == 6 and "0.weight" in kinds["permutation"].params
    assert "1.weight" in kinds["scaling"].params
    for g in spec.groups:
        if g.kind == "scaling":
            assert "0.weight" not in g.params


def test_batchnorm_training_mode_is_traced_in_eval():
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2)).train()
    spec = wsym.detect(model, torch.randn(8, 4))
    assert model.training, "detect must restore the training flag"
    assert spec.kinds() == {"permutation": 1, "scaling": 1, "norm_scaling": 1, "sign": 1}


def test_detect_does_not_modify_the_model():
    model = MLP(4, [5], 3)
    before = copy.deepcopy(model.state_dict())
    wsym.detect(model, torch.randn(2, 4))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_data_dependent_control_flow_is_verified_on_the_module_and_said_in_one_line(capfd):
    torch.manual_seed(0)
    model, x = DataDependentClamp(), torch.randn(3, 4)
    with pytest.warns(UserWarning) as record:
        spec = wsym.detect(model, x)
    assert spec.kinds() == {"permutation": 1}  # the specialized trace alone says scaling too
    said = [str(w.message) for w in record if "data-dependent control flow" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0]
    assert "verified on the module" in said[0]
    assert "def forward" not in capfd.readouterr().err  # no FX graph dump on stderr
    md = copy.deepcopy(model).double()
    for seed in range(3):
        moved = copy.deepcopy(md)
        moved.load_state_dict(spec.act(spec.sample(seed=seed, scale=(0.1, 10)), md.state_dict()))
        for xx in (x.double(), 20 * x.double()):
            with torch.no_grad():
                y0, y1 = md(xx), moved(xx)
            assert (y1 - y0).abs().max() <= 1e-12 * y0.abs().max()


def test_debug_logging_keeps_torchs_report(caplog):
    import logging

    from wsym.detect.tracing.export import trace  # torch.export, falling back to a recording

    with caplog.at_level(logging.DEBUG, logger="wsym"), pytest.warns(UserWarning):
        trace(DataDependentClamp(), torch.randn(3, 4))
    assert any("torch.export failed" in r.getMessage() for r in caplog.records)


def _entry_points(model, bad, spec, x):
    """Every public entry point that reads weights, each called on NaN weights."""
    from wsym.metanet import fit

    batches = [(x, torch.tensor([0, 1]))]
    loss = torch.nn.functional.cross_entropy
    good = [MLP(4, [5], 3).state_dict() for _ in range(3)]
    with warnings.catch_warnings():  # one validation member: its rank correlation is NaN
        warnings.simplefilter("ignore")
        predictor = fit(lambda: MLP(4, [5], 3), good, torch.arange(3.0), spec=spec, epochs=1)
    return {
        "detect": lambda: wsym.detect(model, x),
        "canonicalize": lambda: wsym.canonicalize(bad, spec),
        "align": lambda: wsym.align(bad, good[0], spec),
        "sharpness": lambda: wsym.sharpness(model, batches, loss, spec=spec),
        "hessian-trace": lambda: wsym.sharpness(model, batches, loss, measure="hessian-trace"),
        "teleport": lambda: wsym.teleport(model, spec, batches, loss),
        "metanet.fit": lambda: fit(
            lambda: MLP(4, [5], 3), [*good, bad], torch.arange(4.0), spec=spec
        ),
        "predict": lambda: predictor.predict([good[0], bad]),
    }


def test_nan_weights_are_rejected_with_the_tensors_name_by_every_entry_point():
    torch.manual_seed(0)
    model, x = MLP(4, [5], 3), torch.randn(2, 4)
    spec = wsym.detect(model, x)
    with torch.no_grad():
        model[2].weight[0, 0] = float("nan")
    bad = {k: v.clone() for k, v in model.state_dict().items()}
    for name, call in _entry_points(model, bad, spec, x).items():
        with pytest.raises(WsymInputError, match=r"2\.weight holds NaN") as err:
            call()
        assert "\n" not in str(err.value), name
