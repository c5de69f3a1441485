"""The spec as a data object: serialization, derived maps, table."""

import networkx as nx
import pytest
import torch

import wsym
from wsym.detect.tracing import write_graph
from wsym.errors import WsymInputError
from wsym.group.elements import sample
from wsym.group.spec import SymmetrySpec


@pytest.fixture(scope="module")
def spec_and_model(detected):
    model, inputs, spec = detected("tiny-transformer")
    return spec, model, inputs


def test_json_round_trip(spec_and_model):
    spec, model, inputs = spec_and_model
    again = SymmetrySpec.from_json(spec.to_json())
    assert again == spec
    g = spec.sample(seed=0)
    sd = {k: v.double() for k, v in model.state_dict().items()}
    a, b = spec.act(g, sd), again.act(g, sd)
    for k in sd:
        assert torch.equal(a[k], b[k])


def test_both_directions_of_the_map_agree(spec_and_model):
    spec, _, _ = spec_and_model
    for i, g in enumerate(spec.groups):
        for param, dim in spec.axes_of(g):
            if g.kind != "translation":
                assert i in spec.groups_of(param)[dim]
    for param, _ in spec.layouts:
        for d, groups in enumerate(spec.groups_of(param)):
            for i in groups:
                assert (param, d) in spec.axes_of(spec.groups[i])


def test_sample_kinds_filter(spec_and_model):
    spec, _, _ = spec_and_model
    g = spec.sample(seed=0, kinds=["gl"])
    assert {spec.groups[i].kind for i, _ in g.components} == {"gl"}


def test_table_lists_every_group(spec_and_model):
    spec, _, _ = spec_and_model
    table = spec.table()
    assert len(table.splitlines()) == len(spec.groups) + 2
    assert "gl" in table and "translation" in table


def test_gl_group_dimensions(spec_and_model):
    spec, _, _ = spec_and_model
    qk = next(g for g in spec.groups if g.kind == "gl")
    assert (qk.size, qk.count) == (4, 2)  # GL(4) per head, 2 heads
    assert qk.dimension == 2 * 16


def test_graph_export(spec_and_model, tmp_path):
    spec, _, _ = spec_and_model
    g = spec.graph
    assert isinstance(g, nx.DiGraph)
    kinds = nx.get_node_attributes(g, "kind")
    assert {"parameter", "input", "op", "output"} <= set(kinds.values())
    params = {d["param"] for _, d in g.nodes(data=True) if d.get("kind") == "parameter"}
    assert "blocks.0.attn.q.weight" in params
    write_graph(g, tmp_path / "g.graphml")
    write_graph(g, tmp_path / "g.json")
    assert nx.read_graphml(tmp_path / "g.graphml").number_of_nodes() == g.number_of_nodes()
    with pytest.raises(WsymInputError):
        write_graph(g, tmp_path / "g.txt")


def test_wrong_inputs_give_one_line_error():
    mlp = wsym.models.networks.MLP(4, [5], 2)
    with pytest.raises(WsymInputError, match="fails on the example inputs") as err:
        wsym.detect(mlp, torch.randn(3, 7))
    assert "\n" not in str(err.value)
    with pytest.raises(WsymInputError, match="example inputs of type"):
        wsym.detect(mlp, 3.0)


def test_untraceable_model_gives_one_line_error():
    class DataDependent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            return h[h > 0].sum()  # data-dependent output shape

    with pytest.raises(WsymInputError) as err:
        wsym.detect(DataDependent(), torch.randn(3, 4))
    assert "\n" not in str(err.value)


def test_fallback_tracer_handles_data_dependent_control_flow():
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)

        def forward(self, x):
            h = torch.relu(self.a(x))
            return self.b(h) if h.sum() > 0 else -self.b(h)

    with pytest.warns(UserWarning, match="specialized to the example inputs"):
        spec = wsym.detect(Branchy(), torch.randn(3, 4))
    assert spec.kinds() == {"permutation": 1, "scaling": 1}


def test_fallback_tracer_sees_convolutions():
    from wsym.detect.tracing.record import record

    model = wsym.models.networks.ResidualCNN(channels=3)
    traced = record(model.eval(), (torch.randn(1, 1, 5, 5),), {})
    from wsym.detect.analyze import analyze
    from wsym.detect.solve import solve

    spec = solve(analyze(traced), traced, {**traced.parameters, **traced.buffers})
    assert spec.kinds() == {"norm_scaling": 3, "permutation": 2, "scaling": 2, "sign": 3}


def test_act_on_a_mismatched_state_dict_is_a_clear_error(spec_and_model):
    spec, model, _ = spec_and_model
    g = spec.sample(seed=0)
    sd = dict(model.state_dict())
    del sd["blocks.0.attn.q.weight"]
    with pytest.raises(WsymInputError, match="no entry 'blocks.0.attn.q.weight'"):
        spec.act(g, sd)
    sd = dict(model.state_dict())
    sd["blocks.0.attn.q.weight"] = torch.zeros(3, 3)
    with pytest.raises(WsymInputError, match="has shape"):
        spec.act(g, sd)


def test_verification_elements_move_every_unit(spec_and_model):
    spec, _, _ = spec_and_model
    perm = next(i for i, g in enumerate(spec.groups) if g.kind == "permutation")
    sign = next(i for i, g in enumerate(spec.groups) if g.kind == "sign")
    for seed in range(20):
        g = dict(sample(spec, seed=seed, groups=[perm, sign], moving=True).components)
        assert (g[perm] != torch.arange(spec.groups[perm].size)).all()
        assert (g[sign] < 0).any()
        flipped = dict(
            sample(spec, seed=seed, groups=[perm, sign], moving=True, flip=True).components
        )
        assert torch.equal(flipped[sign], -g[sign])


def test_spec_is_a_value_nothing_writes_into(spec_and_model):
    import dataclasses

    spec, model, _ = spec_and_model
    fields = {f.name for f in dataclasses.fields(spec)}
    sd = {k: v.double() for k, v in model.state_dict().items()}
    wsym.canonicalize(spec.act(spec.sample(seed=0), sd), spec)
    assert set(spec.__dict__) == fields  # memos live beside the spec, not in it
    assert hash(spec) == hash(SymmetrySpec.from_json(spec.to_json()))
    assert spec.graph is not None and "graph" not in fields
    again = dataclasses.replace(spec)
    assert again == spec and again.graph is None  # the graph is beside the value, not part of it
