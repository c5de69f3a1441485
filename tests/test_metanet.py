"""Weight graphs, invariance and sensitivity, fitting, files of the meta-network."""

from __future__ import annotations

import pytest
import torch
from cases import fit_scaled_mlps, scaled_mlp_population

pytest.importorskip("torch_geometric")

import wsym
from wsym.errors import WsymInputError
from wsym.group.spec import Leaf, Split
from wsym.metanet import GraphSchema, Predictor, fit, kendall_tau, load
from wsym.metanet.graph import axis_entries
from wsym.metanet.predictor import network_for
from wsym.models.networks import MLP
from wsym.testing import assert_invariant, assert_sensitive, invariance_error

GRAPH_CASES = [
    "mlp-relu",
    "mlp-tanh",
    "swiglu",
    "depthwise",
    "residual-cnn",
    "tiny-transformer",
    "tiny-transformer-rotary",
    "tiny-transformer-tokens",
    "diagonal-net",
    "concat",
    "tied-embedding",
    "group-norm",
    "radial",
    "rmsnorm-residual",
    "mha",
    "transformer-encoder-layer",
    "gqa",
]
INVARIANT_CASES = [
    "mlp-relu",
    "mlp-tanh",
    "residual-cnn",
    "tiny-transformer",
    "mha",
    "group-norm",
    "rmsnorm-residual",
    "swiglu",
]


def _random_predictor(spec, seed=0, hidden=16):
    torch.manual_seed(seed)
    net = network_for(GraphSchema.from_spec(spec), hidden, 2, 1)
    return Predictor(spec, net, {"targets": ["gap"], "target_mean": [0.0], "target_std": [1.0]})


def _double(sd):
    return {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}


def test_axis_entries_products_and_concatenations():
    a, b = Leaf(0, 2, 0, 0), Leaf(1, 3, 0, 1)
    assert axis_entries(Split("prod", (a, b)))[:4] == [
        ((0, 0), (1, 0)),
        ((0, 0), (1, 1)),
        ((0, 0), (1, 2)),
        ((0, 1), (1, 0)),
    ]
    assert axis_entries(Split("cat", (a, b))) == [
        ((0, 0),),
        ((0, 1),),
        ((1, 0),),
        ((1, 1),),
        ((1, 2),),
    ]


@pytest.mark.parametrize("name", GRAPH_CASES)
def test_graph_accounts_for_every_weight(detected, name):
    model, _, spec = detected(name)
    schema = GraphSchema.from_spec(spec)
    data = schema.graph(model.state_dict())
    sd = model.state_dict()
    edge_plans = [p for p in schema.plans if p.kind == "edge"]
    n_edges = sum(p.shape[p.node_axes[0]] * p.shape[p.node_axes[1]] for p in edge_plans)
    assert data.edge_index.shape == (2, n_edges)
    assert data.edge_attr.shape == (n_edges, schema.edge_width)
    assert data.edge_index.numel() == 0 or int(data.edge_index.max()) < data.num_nodes
    # every entry of every tensor lands in the graph exactly once (up to zero padding)
    total = sum(float(sd[p.name].double().abs().sum()) for p in schema.plans if not p.pooled_axes)
    got = float(
        data.edge_attr.abs().sum() + data.attr_val.abs().sum() + data.graph_attr.abs().sum()
    )
    assert got == pytest.approx(total, rel=1e-9)


def test_graph_builds_for_resnet18(detected):
    pytest.importorskip("torchvision")
    model, _, spec = detected("resnet18")
    data = GraphSchema.from_spec(spec).graph(model.state_dict())
    assert data.num_nodes > 1000 and data.edge_attr.shape[1] == 49  # 7x7 stem kernel


def test_graph_permutes_with_the_weights(detected):
    model, _, spec = detected("mlp-relu")
    schema = GraphSchema.from_spec(spec)
    sd = _double(model.state_dict())
    moved = spec.act(spec.sample(seed=3, kinds=["permutation"]), sd)
    a, b = schema.graph(sd), schema.graph(moved)
    key = lambda d: sorted(zip(d.edge_type.tolist(), d.edge_attr[:, 0].tolist(), strict=True))  # noqa: E731
    assert key(a) == key(b)
    assert not torch.equal(a.edge_attr, b.edge_attr)


# an orthogonal block with fewer rows than its size has no unique canonical form (said once)
@pytest.mark.filterwarnings("ignore:.*fewer rows than its size:wsym.errors.SymmetryWarning")
@pytest.mark.parametrize("name", INVARIANT_CASES)
def test_prediction_invariant_to_the_whole_spec(detected, name):
    model, _, spec = detected(name)
    p = _random_predictor(spec).double()
    sd = _double(model.state_dict())
    assert_invariant(lambda s: p.predict(s), spec, sd, tol=1e-5, seeds=(0,))
    assert_sensitive(lambda s: p.predict(s), spec, sd, min_change=1e-8)


def test_float32_prediction_invariant(detected):
    model, _, spec = detected("mlp-relu")
    p = _random_predictor(spec)
    assert invariance_error(lambda s: p.predict(s), spec, _double(model.state_dict())) < 1e-5


def test_testing_helpers_catch_failures(detected):
    model, _, spec = detected("mlp-relu")
    sd = _double(model.state_dict())
    with pytest.raises(AssertionError, match="not invariant"):
        assert_invariant(lambda s: s["0.weight"].sum(), spec, sd)
    with pytest.raises(AssertionError, match="too symmetric"):
        assert_sensitive(lambda s: torch.tensor(1.0), spec, sd)


@pytest.fixture(scope="module")
def trained():
    sds, y = scaled_mlp_population(36)
    p = fit_scaled_mlps(
        sds[:28],
        y[:28],
        epochs=40,
        patience=40,
        hidden=16,
        seed=0,
    )
    return p, sds, y


def test_fit_learns_a_function_of_the_weights(trained):
    p, sds, y = trained
    tau = kendall_tau(y[28:], p.predict(sds[28:]))
    assert tau > 0.5, tau
    assert p.config["report"]["train_members"] == 22 and p.config["report"]["val_members"] == 6


def test_fit_is_deterministic(trained):
    p, sds, y = trained
    again = fit(
        lambda: MLP(4, [6], 3),
        sds[:28],
        y[:28],
        spec=p.spec,
        epochs=40,
        patience=40,
        hidden=16,
        seed=0,
    )
    assert torch.equal(again.predict(sds[28:]), p.predict(sds[28:]))


def test_save_load_roundtrip_and_wrong_architecture(trained, tmp_path):
    p, sds, _ = trained
    path = tmp_path / "m.safetensors"
    p.save(path)
    q = load(path)
    assert torch.allclose(q.predict(sds[28:]), p.predict(sds[28:]), atol=1e-6)
    with pytest.raises(WsymInputError, match=r"'0.weight' has shape \[8, 4\], expected \[6, 4\]"):
        q.predict(MLP(4, [8], 3).state_dict())
    with pytest.raises(WsymInputError, match="no entry '2.weight'"):
        q.predict({"0.weight": torch.zeros(6, 4), "0.bias": torch.zeros(6)})
    with pytest.raises(WsymInputError, match="not found"):
        load(tmp_path / "missing.safetensors")


def test_fit_rejects_bad_input():
    with pytest.raises(WsymInputError, match="example_inputs"):
        fit(lambda: MLP(4, [6], 3), [], [])
    spec = wsym.detect(MLP(4, [6], 3), torch.randn(2, 4))
    with pytest.raises(WsymInputError, match="one target per state dict"):
        fit(None, [MLP(4, [6], 3).state_dict()] * 3, [1.0, 2.0], spec=spec)


def test_statistics_readout_and_old_format(trained, tmp_path):
    import json

    from safetensors.torch import load_file, safe_open, save_file

    from wsym.metanet.statistics import statistic_width, tensor_statistics

    p, sds, _ = trained
    g = p.graphs(sds[:1])[0]
    widths = [statistic_width(plan.shape) for plan in p.schema.plans]
    assert g.stat_attr.shape == (1, sum(widths)) == (1, p.schema.stat_width)
    assert widths[0] == 25 and widths[1] == 9  # 0.weight (6, 4): matrix statistics; 0.bias
    form = wsym.metanet.invariant_form(sds[0], p.spec)
    assert torch.allclose(g.stat_attr[0, :7], tensor_statistics(form[p.schema.plans[0].name]))
    path = tmp_path / "m.safetensors"
    p.save(path)
    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["wsym.metanet"])
    meta["format"] = 2
    save_file(load_file(str(path)), str(path), metadata={"wsym.metanet": json.dumps(meta)})
    with pytest.raises(WsymInputError, match="another version.*retrain"):
        load(path)


def test_statistics_stage_alone_and_graph_residual(trained):
    from wsym.metanet import batch_graphs

    p, sds, y = trained
    q = fit(None, sds[:28], y[:28], spec=p.spec, epochs=0, hidden=16, seed=0)
    rep = q.config["report"]
    assert rep["best_epoch"] == 0 and rep["val_tau"] == rep["statistics_val_tau"]
    with torch.no_grad():
        assert torch.count_nonzero(q.net.graph_branch(batch_graphs(q.graphs(sds[:4])))) == 0
    assert kendall_tau(y[28:], q.predict(sds[28:])) > 0.5
