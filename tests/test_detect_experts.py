"""Mixtures of experts: one group per expert (stacked, ModuleList, Mixtral); T5 heads."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from cases import ListMoE, independent_deviation, mixtral_config, moe_gates
from torch import nn

import wsym
from wsym.detect import detection_trace, find_candidates, verify_candidates
from wsym.detect.experts import verified_split
from wsym.errors import WsymInputError
from wsym.group.layout import gather, scatter
from wsym.group.spec import Group, Leaf
from wsym.sharpness import sharpness

E, F, D, K = 3, 5, 4, 2


def _gates(x: torch.Tensor, router: torch.Tensor) -> torch.Tensor:
    return moe_gates(x, router, K)


class StackedMoE(nn.Module):
    """Experts stacked as ``w1 (E, F, D)``, ``w2 (E, D, F)`` (as Mixtral stores them), ReLU.

    ``pairing`` sends expert ``e``'s hidden units to ``w2[pairing[e]]``: the identity
    is a mixture of experts; a roll is the negative control (units of expert ``e``
    are read by another expert's down projection, so only a shared S_F holds).
    """

    def __init__(self, pairing=None):
        super().__init__()
        self.router = nn.Linear(D, E, bias=False)
        self.w1 = nn.Parameter(torch.randn(E, F, D))
        self.w2 = nn.Parameter(torch.randn(E, D, F))
        self.head = nn.Linear(D, 2)
        self.pairing = pairing

    def forward(self, x):
        h = torch.relu(torch.einsum("sd,efd->sef", x, self.w1))
        w2 = self.w2 if self.pairing is None else torch.stack([self.w2[e] for e in self.pairing])
        y = torch.einsum("sef,edf->sed", h, w2)
        return self.head(torch.einsum("se,sed->sd", _gates(x, self.router.weight), y))


def _detect(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wsym.detect(model, x)


def _table(spec) -> list[tuple]:
    return sorted((g.kind, g.notation, g.params) for g in spec.groups)


@pytest.fixture(scope="module")
def stacked():
    torch.manual_seed(0)
    model = StackedMoE().double().eval()
    x = torch.randn(16, D, dtype=torch.float64)
    return model, x, _detect(model, x)


def test_stacked_experts_get_one_group_per_expert(stacked):
    model, x, spec = stacked
    experts = ("w1", "w2")
    assert [t for t in _table(spec) if set(t[2]) & set(experts)] == [
        ("gl", f"GL({D})", ("w2", "head.weight")),
        ("permutation", f"S_{E}", (*experts, "router.weight")),  # the experts, router rows too
        ("permutation", f"S_{F}^{E}", experts),
        ("scaling", f"((R+)^{F})^{E}", experts),
    ], spec.table()
    per_expert = [g for g in spec.groups if g.params == experts]
    assert all(g.count == E and len(g.index) == 1 for g in per_expert)
    assert independent_deviation(model, x, spec, seeds=(0, 1)) < 1e-12


def test_each_expert_moves_on_its_own(stacked):
    """One element moves expert 0's units and leaves the others' as they are."""
    model, x, spec = stacked
    i = next(i for i, g in enumerate(spec.groups) if g.kind == "permutation" and g.index)
    perm = torch.arange(F).repeat(E, 1)
    perm[0] = torch.tensor([4, 0, 3, 1, 2])
    moved = spec.act(wsym.group.elements.GroupElement(((i, perm),)), model.state_dict())
    assert torch.equal(moved["w1"][0], model.w1[0, perm[0]].detach())
    assert torch.equal(moved["w1"][1:], model.w1[1:].detach())
    assert torch.equal(moved["w2"][0], model.w2[0][:, perm[0]].detach())
    with torch.no_grad():
        y0 = model(x)
        y1 = torch.func.functional_call(model, moved, (x,))
    assert (y1 - y0).abs().max() < 1e-12 * y0.abs().max()


def test_a_wrong_per_expert_claim_is_caught(stacked):
    """Negative control: the experts' pairing rolled, per-expert groups no longer hold."""
    model, x, spec = stacked
    rolled = StackedMoE(pairing=[1, 2, 0]).double().eval()
    rolled.load_state_dict(model.state_dict())
    assert independent_deviation(rolled, x, spec, seeds=(0,)) > 1e-2
    found = _detect(rolled, x)
    assert not any(g.index for g in found.groups if g.kind != "gl"), found.table()
    assert independent_deviation(rolled, x, found, seeds=(0, 1)) < 1e-12


def test_expert_permutation_without_the_router_rows_is_caught(stacked):
    """Negative control: S_E on the experts' slices alone (the router's rows left) is false."""
    model, x, spec = stacked
    groups = [
        dataclasses.replace(g, params=("w1", "w2")) if "router.weight" in g.params else g
        for g in spec.groups
    ]
    assert len([g for g in groups if g.params == ("w1", "w2") and g.kind == "permutation"]) == 2
    wrong = dataclasses.replace(spec, groups=tuple(groups))
    assert independent_deviation(model, x, wrong, seeds=(0,)) > 1e-2


def test_a_false_split_falls_back_to_the_shared_groups(stacked):
    """The stacked model's candidates verified on the rolled one: per-expert groups fail,
    the shared S_F and (R+)^F (one element for every expert) are what is kept."""
    model, x, _ = stacked
    rolled = StackedMoE(pairing=[1, 2, 0]).double().eval()
    rolled.load_state_dict(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        candidates = find_candidates(detection_trace(model, x), model)
        found = verified_split(candidates, lambda s: verify_candidates(s, rolled, x))
    assert [t[:2] for t in _table(found) if t[2] == ("w1", "w2")] == [
        ("permutation", f"S_{F}"),
        ("scaling", f"(R+)^{F}"),
    ], found.table()
    assert independent_deviation(rolled, x, found, seeds=(0, 1)) < 1e-12


def test_module_list_experts_have_their_own_hidden_units():
    """Each expert's hidden units are a class of their own.

    Permuting whole experts with the router's rows is a module permutation
    (``tests/test_detect_expert_modules.py``).
    """
    torch.manual_seed(0)
    model = ListMoE().double().eval()
    x = torch.randn(16, D, dtype=torch.float64)
    spec = _detect(model, x)
    hidden = [
        (g.kind, g.notation, g.params)
        for g in spec.groups
        if all(p.startswith("experts.") for p in g.params)
    ]
    assert sorted(hidden) == sorted(
        (kind, sym, (f"experts.{e}.0.weight", f"experts.{e}.2.weight"))
        for e in range(E)
        for kind, sym in (("permutation", f"S_{F}"), ("scaling", f"(R+)^{F}"))
    ), spec.table()
    assert independent_deviation(model, x, spec, seeds=(0, 1)) < 1e-12


def test_consumers_refuse_per_expert_groups_in_one_line(stacked):
    """The sharpness gauge reads one copy per class (canonicalize and align read them per
    copy: ``tests/test_align_experts.py``)."""
    model, x, spec = stacked
    batches = [(x, torch.zeros(len(x), dtype=torch.long))]
    loss = nn.functional.cross_entropy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the same GL(4): the head has 2 rows, left out
        with pytest.raises(WsymInputError, match="one copy per expert") as err:
            sharpness(model, batches, loss, spec=spec, measure="geodesic-inv", steps=1)
    assert "\n" not in str(err.value)
    g = Group("permutation", F, E, ("w1",), cls=0, index=(1,))
    lv = [Leaf(1, E, 0, 0), Leaf(0, F, 0, 1)]
    with pytest.raises(ValueError, match="one copy per index value"):  # one shared value
        wsym.group.kinds.kind_of(g).block_fn(g, torch.arange(F))(torch.zeros(E, F), lv)


def test_per_expert_laws(stacked):
    """inverse and compose per expert; act(compose(a, b)) == act(a) after act(b)."""
    _, _, spec = stacked
    sd = {k: v.detach() for k, v in stacked[0].state_dict().items()}
    for i, g in enumerate(spec.groups):
        if not g.index or g.kind == "gl":
            continue
        k = wsym.group.kinds.kind_of(g)
        gen = torch.Generator().manual_seed(i)
        a, b = k.sample(spec, g, gen, (0.1, 10)), k.sample(spec, g, gen, (0.1, 10))
        assert a.shape == (E, F)
        both = k.act(spec, g, k.compose(g, a, b), sd)
        step = k.act(spec, g, a, {**sd, **k.act(spec, g, b, sd)})
        back = k.act(spec, g, k.inverse(g, a), {**sd, **k.act(spec, g, a, sd)})
        for key in g.params:
            assert torch.allclose(both[key], step[key], rtol=1e-13, atol=0)
            assert torch.allclose(back[key], sd[key], rtol=1e-13, atol=0)


def _mixtral(transformers, experts: int = 3, implementation: str | None = None):
    cfg = mixtral_config(transformers, layers=2, experts=experts)
    if implementation is not None:
        cfg._experts_implementation = implementation
    torch.manual_seed(0)
    return transformers.MixtralModel(cfg).eval()


def test_mixtral_experts_get_one_group_each():
    """Detected (and verified in float32 where ``grouped_mm`` has no float64 kernel), then
    checked independently in float64 on the same weights with the batched expert kernel."""
    transformers = pytest.importorskip("transformers")
    model = _mixtral(transformers)
    x = {"input_ids": torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))}
    spec = _detect(model, x)
    experts = ("layers.0.mlp.experts.gate_up_proj", "layers.0.mlp.experts.down_proj")
    assert [t[:2] for t in _table(spec) if t[2] == experts] == [
        ("permutation", "S_16^3"),
        ("scaling", "((R+)^16)^3"),
        ("sign", "(Z2^16)^3"),
    ], spec.table()
    router = "layers.0.mlp.gate.weight"
    assert [t[:2] for t in _table(spec) if t[2] == (router, *experts)] == [("permutation", "S_3")]
    assert "expert axis" in spec.explain(router)
    second = [g.params for g in spec.groups if g.notation == "S_3"]  # each router, its experts
    assert second == [
        (router, *experts),
        tuple(p.replace("layers.0", "layers.1") for p in second[0]),
    ]
    try:
        dev = independent_deviation(model, x, spec, seeds=(0, 1))
    except RuntimeError:  # grouped_mm has no float64 kernel: the same function, batched
        same = _mixtral(transformers, implementation="batched_mm")
        same.load_state_dict(model.state_dict())
        dev = independent_deviation(same, x, spec, seeds=(0, 1))
    # Mixtral's router takes its softmax in float32 whatever the weights' dtype
    # (``router_logits.float()``): permuting the experts reorders that float32 sum,
    # moving the routing weights by a float32 unit (5e-8 of the outputs here; each
    # other group measures 0.0). False groups move outputs by 1e-2 and more (above).
    assert dev < 1e-6


def test_mixtral_is_read_from_its_recorded_pass():
    """Its expert dispatch (``sort``, an inverse permutation by ``index_put_``) holds only
    integer ops, read alike by any tracer: no torch.export (3 s of 3.1 s before), and the
    router is found through the recorded ``mm(x, t(W))``."""
    transformers = pytest.importorskip("transformers")
    from wsym.detect import detection_trace
    from wsym.detect.experts import router_weights

    model = _mixtral(transformers)
    x = {"input_ids": torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))}
    traced = detection_trace(model, x)
    assert traced.program is None
    assert router_weights(traced) == {
        f"layers.{i}.mlp.gate.weight": frozenset(
            {f"layers.{i}.mlp.experts.gate_up_proj", f"layers.{i}.mlp.experts.down_proj"}
        )
        for i in (0, 1)
    }


def _t5(model, sd, ids):
    call = torch.func.functional_call
    return call(model, sd, (), {"input_ids": ids}, tie_weights=False).last_hidden_state


def test_t5_per_layer_head_permutations_fail():
    """The position bias of layer 0 is added in every layer: one head permutation for all.

    Permuting the heads of the second encoder layer alone (its q, k, v rows and o
    columns, head by head) changes the outputs; the shared permutation is the
    whole head group detection reports.
    """
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.T5Config(
        d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4, vocab_size=100
    )
    model = transformers.T5EncoderModel(cfg).double().eval()
    ids = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    units = torch.tensor([1, 0, 3, 2]).repeat_interleave(8) * 8 + torch.arange(8).repeat(4)
    att = "encoder.block.1.layer.0.SelfAttention."
    for name in ("q", "k", "v"):
        sd[att + name + ".weight"] = sd[att + name + ".weight"][units]
    sd[att + "o.weight"] = sd[att + "o.weight"][:, units]
    with torch.no_grad():
        y0 = model(input_ids=ids).last_hidden_state
        y1 = _t5(model, sd, ids)
    assert (y1 - y0).abs().max() > 1e-3 * y0.abs().max()
    bias = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    sd[bias] = sd[bias][:, torch.tensor([1, 0, 3, 2])]  # moving the shared table breaks layer 0
    with torch.no_grad():
        y2 = _t5(model, sd, ids)
    assert (y2 - y0).abs().max() > 1e-3 * y0.abs().max()


def test_per_expert_scaling_blocks_read_one_unit_of_one_expert(stacked):
    """The block reader (the quotient's GL(1) blocks): one block per expert and unit."""
    model, _, spec = stacked
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    g = next(g for g in spec.groups if g.kind == "scaling" and g.index)
    parts = gather(spec, g, sd)
    assert {k: tuple(v.shape) for k, v in parts.items()} == {0: (E * F, D, 1), 1: (E * F, D, 1)}
    assert torch.equal(parts[0][F + 2, :, 0], sd["w1"][1, 2])  # expert 1, unit 2: its row
    assert torch.equal(parts[1][F + 2, :, 0], sd["w2"][1, :, 2])
    back = scatter(spec, g, parts, sd)
    assert all(torch.equal(back[k], sd[k]) for k in ("w1", "w2"))
    scales = torch.rand(E, F, dtype=torch.float64) + 0.5
    moved = wsym.group.kinds.kind_of(g).act(spec, g, scales, sd)
    after = gather(spec, g, moved)
    assert torch.allclose(after[0], parts[0] * scales.reshape(-1, 1, 1), rtol=1e-15, atol=0)


def test_per_expert_conserved_quantities(stacked):
    """Gradient flow conserves, per expert and unit, ``|w1 row|^2 - |w2 column|^2``."""
    model, _, spec = stacked
    sd = model.state_dict()
    q = spec.conserved(sd)
    i = next(i for i, g in enumerate(spec.groups) if g.kind == "scaling" and g.index)
    expected = (sd["w1"] ** 2).sum(-1) - (sd["w2"] ** 2).sum(1)
    assert q[i].shape == (E, F)
    assert torch.allclose(q[i], expected, rtol=1e-13, atol=1e-13)
