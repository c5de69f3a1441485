"""Experts in an ``nn.ModuleList``: the expert permutation S_E moves whole modules."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch
from cases import ListMoE, assert_group_laws, independent_deviation

import wsym
from wsym.detect import detection_trace, find_candidates, verify_candidates
from wsym.errors import SymmetryWarning, WsymInputError
from wsym.group.elements import GroupElement
from wsym.group.spec import SymmetrySpec

E, F, D, K = 3, 5, 4, 2


def _case(fixed=False):
    torch.manual_seed(0)
    model = ListMoE(E, F, D, K, fixed=fixed).double().eval()
    x = torch.randn(16, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return model, x


def _detect(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wsym.detect(model, x)


def _experts(e):
    return (f"experts.{e}.0.weight", f"experts.{e}.2.weight")


def _module_group(spec):
    return next(i for i, g in enumerate(spec.groups) if g.kind == "module_permutation")


@pytest.fixture(scope="module")
def listed():
    model, x = _case()
    return model, x, _detect(model, x)


def test_module_list_experts_get_the_expert_permutation(listed):
    model, x, spec = listed
    table = sorted((g.kind, g.notation, g.params) for g in spec.groups)
    every = tuple(k for e in range(E) for k in _experts(e))
    assert table == sorted(
        [
            ("gl", "GL(4)", tuple(f"experts.{e}.2.weight" for e in range(E)) + ("head.weight",)),
            ("module_permutation", f"S_{E}", ("router.weight", *every)),
        ]
        + [(kind, sym, _experts(e)) for e in range(E) for kind, sym in
           (("permutation", f"S_{F}"), ("scaling", f"(R+)^{F}"))]
    ), spec.table()  # fmt: skip
    g = spec.groups[_module_group(spec)]
    assert g.target == tuple(_experts(e) for e in range(E))
    assert independent_deviation(model, x, spec, seeds=(0, 1, 2, 3)) < 1e-12


def test_top_k_routing_has_no_ties_on_generic_weights(listed):
    """The top-2 choice is strict on every input the checks use (example, fresh, x20)."""
    model, x, _ = listed
    for xx in (x, torch.randn_like(x), 20 * torch.randn_like(x)):
        logits = model.router(xx).sort(-1).values
        assert (logits[:, 1:] - logits[:, :-1]).min() > 1e-6


def test_act_moves_whole_experts_with_the_router_rows(listed):
    model, _, spec = listed
    sd = model.state_dict()
    perm = torch.tensor([2, 0, 1])
    moved = spec.act(GroupElement(((_module_group(spec), perm),)), sd)
    assert torch.equal(moved["router.weight"], sd["router.weight"][perm])
    for u in range(E):
        for mine, theirs in zip(_experts(u), _experts(int(perm[u])), strict=True):
            assert torch.equal(moved[mine], sd[theirs])
    assert torch.equal(moved["head.weight"], sd["head.weight"])


def test_group_laws_and_serialization(listed):
    model, _, spec = listed
    assert_group_laws(spec, model.state_dict())
    assert SymmetrySpec.from_json(spec.to_json()) == spec


def test_without_the_router_rows_the_claim_is_caught(listed):
    """Negative control: the experts renumbered, the router left as it is."""
    model, x, spec = listed
    i = _module_group(spec)
    g = spec.groups[i]
    bare = dataclasses.replace(g, cls=-1, params=g.params[1:])
    bad = dataclasses.replace(spec, groups=(bare,), deviations=())
    assert independent_deviation(model, x, bad, seeds=(0,)) > 1e-2
    assert bad.verify(model, x).failed == [0]


def test_experts_weighed_apart_keep_no_expert_permutation():
    """Negative control: the candidate is proposed from the graph, and verification drops it."""
    model, x = _case(fixed=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        candidates = find_candidates(detection_trace(model, x), model)
    assert [g.kind for g in candidates.groups].count("module_permutation") == 1
    with pytest.warns(SymmetryWarning, match="dropped unverified module_permutation"):
        found = verify_candidates(candidates, model, x)
    assert "module_permutation" not in found.kinds()
    assert independent_deviation(model, x, found, seeds=(0, 1)) < 1e-12


def test_consumers_that_read_classes_refuse_in_one_line(listed):
    from wsym.metanet.graph import GraphSchema

    model, _, spec = listed
    sd = model.state_dict()
    for call in (
        lambda: wsym.canonicalize(sd, spec),
        lambda: wsym.align(sd, copy.deepcopy(sd), spec),
        lambda: GraphSchema(spec),
    ):
        with pytest.raises(WsymInputError, match="permutes whole modules") as err:
            call()
        assert "\n" not in str(err.value)
    kept = [k for k in spec.kinds() if k != "module_permutation"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GL(4) on the outputs: not unique, left as it is
        assert wsym.canonicalize(sd, spec, kinds=kept).keys() == sd.keys()


def test_sharpness_is_unchanged_by_renumbered_experts(listed):
    """Renumbering experts is an isometry of the weights: Euclidean sharpness is unchanged.

    (The continuous groups move it: the negative control.)
    """
    from wsym.sharpness import sharpness

    model, x, spec = listed
    target = torch.randn(len(x), 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def value(element):
        other = copy.deepcopy(model)
        other.load_state_dict(spec.act(element, model.state_dict()))
        loss = lambda out, t: ((out - t) ** 2).mean()  # noqa: E731
        return sharpness(other, [(x, target)], loss, spec=spec, measure="euclidean", steps=3)

    g = spec.sample(5, scale=(1e-2, 1e2))
    i = _module_group(spec)
    before = value(GroupElement(()))
    mine = GroupElement(tuple(c for c in g.components if c[0] == i))
    rest = GroupElement(tuple(c for c in g.components if c[0] != i))
    assert value(mine) == before
    assert abs(value(rest) - before) > 0.1 * before
