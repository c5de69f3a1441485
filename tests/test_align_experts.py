"""Canonical forms and alignment of mixtures of experts: one S_n (and scales, signs) per expert.

Every group with one copy per expert is read, balanced, signed, sorted and
matched per copy; the experts' own permutation is a class of its own. Checked
on the stacked experts of ``tests/test_detect_experts.py`` and on Hugging Face's
Mixtral, against planted elements of the whole group (all kinds, scales 0.1..10).
"""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from cases import mixtral_config
from test_detect_experts import E, F, StackedMoE

import wsym
from wsym.align.canonicalize import _order
from wsym.align.choice import path_objective
from wsym.align.matching import per_copy_assignment, weight_matching
from wsym.group.elements import GroupElement, act


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # GL(4) on the outputs: 2 rows, left as it is
        return fn(*args, **kwargs)


def _relative(a: dict, b: dict) -> float:
    num = sum(float((a[k].double() - v.double()).pow(2).sum()) for k, v in b.items())
    return (num / sum(float(v.double().pow(2).sum()) for v in b.values())) ** 0.5


# The stacked experts' GL(4) on the outputs meets a head of 2 rows: no unique canonical form
KINDS = {"stacked": ["permutation", "scaling"], "mixtral": None}


@pytest.fixture(scope="module")
def stacked():
    torch.manual_seed(0)
    model = StackedMoE().double().eval()
    x = torch.randn(16, 4, dtype=torch.float64)
    spec = _quiet(wsym.detect, model, x)
    return model, x, spec, {k: v.detach() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def mixtral():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.MixtralModel(mixtral_config(transformers, layers=2, experts=3)).eval()
    x = {"input_ids": torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))}
    spec = _quiet(wsym.detect, model, x)
    sd = {k: v.detach().double() for k, v in model.state_dict().items()}
    return model, x, spec, sd


def test_the_specs_hold_groups_with_one_copy_per_expert(stacked, mixtral):
    for _, _, spec, _ in (stacked, mixtral):
        indexed = {g.kind for g in spec.groups if g.index and g.kind != "gl"}
        assert indexed == {"permutation", "scaling"} or indexed >= {"permutation", "sign"}


@pytest.mark.parametrize("case", ["stacked", "mixtral"])
@pytest.mark.parametrize("seed", [0, 1])
def test_canonical_form_is_invariant_under_the_whole_group(case, seed, request):
    _, _, spec, sd = request.getfixturevalue(case)
    moved = spec.act(spec.sample(seed=seed, scale=(0.1, 10), kinds=KINDS[case]), sd)
    assert _relative(moved, sd) > 0.1
    a = _quiet(wsym.canonicalize, sd, spec, kinds=KINDS[case], dtype=torch.float64)
    b = _quiet(wsym.canonicalize, moved, spec, kinds=KINDS[case], dtype=torch.float64)
    assert _relative(b, a) < 1e-10


@pytest.mark.parametrize("case", ["stacked", "mixtral"])
def test_align_recovers_a_planted_element_of_the_whole_group(case, request):
    _, _, spec, sd = request.getfixturevalue(case)
    moved = spec.act(spec.sample(seed=3, scale=(0.1, 10)), sd)  # every kind
    back, report = _quiet(wsym.align, sd, moved, spec, dtype=torch.float64, with_report=True)
    assert report.recovered
    assert _relative(back, sd) < 1e-8


def test_weight_matching_undoes_per_expert_permutations(mixtral):
    _, _, spec, sd = mixtral
    perms = spec.sample(seed=2, kinds=["permutation"])
    assert any(spec.groups[i].index for i, _ in perms.components)
    moved = spec.act(perms, sd)
    comps = weight_matching(spec, sd, moved)
    back = act(spec, GroupElement(tuple(comps)), moved)
    assert _relative(back, sd) < 1e-12


def test_align_with_data_moves_within_the_orbit(stacked):
    """Two different networks: the aligned one computes the same function, on a lower path."""
    model, x, spec, sd = stacked
    torch.manual_seed(1)
    other = {k: v.detach() for k, v in StackedMoE().double().state_dict().items()}
    batches = [(x, torch.randint(0, 2, (len(x),), generator=torch.Generator().manual_seed(0)))]
    aligned, report = _quiet(
        wsym.align, sd, other, spec, model=model, batches=batches, with_report=True
    )
    assert report.objective == "path" and report.chosen in report.values
    at = lambda s: torch.func.functional_call(model, s, (x * 20,))  # noqa: E731
    with torch.no_grad():
        assert torch.allclose(at(aligned), at(other), rtol=1e-9, atol=1e-9)
    value = report.values[report.chosen]
    assert value == pytest.approx(path_objective(model, sd, aligned, batches))
    assert value < path_objective(model, sd, other, batches)


def test_per_copy_order_and_assignment_solve_each_copy():
    gen = torch.Generator().manual_seed(0)
    units = torch.randn(E, F, 6, generator=gen, dtype=torch.float64)
    order = _order(units)
    for e in range(E):
        assert torch.equal(order[e], _order(units[e]))
    score = torch.randn(E, F, F, generator=gen, dtype=torch.float64)
    perm = per_copy_assignment(score)
    for e in range(E):
        assert torch.equal(perm[e], per_copy_assignment(score[e]))


def test_experts_are_scored_with_their_units_inside_within_the_budget(mixtral, monkeypatch):
    matching = importlib.import_module("wsym.align.matching")
    _, _, spec, _ = mixtral
    experts = [p for p in matching.plans(spec) if p.inner]
    assert experts and all(spec.groups[p.group].size == 3 for p in experts)
    monkeypatch.setattr(matching, "INNER_ENTRIES", (3 * 16) ** 2 - 1)
    assert not any(p.inner for p in matching.plans(spec))
