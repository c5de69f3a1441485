"""The kind classes against the element layer they replaced, and the group laws.

Same seeds give the same elements, bit for bit, and acting gives the same state
dicts (to round-off) as the frozen pre-redesign implementation (:mod:`legacy_act`);
compose and inverse obey the group laws on every kind.
"""

import copy

import legacy_act
import pytest
import torch
from cases import CASES
from hypothesis import given, settings
from hypothesis import strategies as st

from wsym.group import elements
from wsym.group.elements import GroupElement, act, sample
from wsym.group.kinds import KIND_CLASSES, kind_of, kinds_where

FAST = [c.name for c in CASES if not c.slow]


def _state(model) -> dict:
    return {k: v.double() if v.is_floating_point() else v for k, v in model.state_dict().items()}


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return all(_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", FAST)
def test_elements_are_bit_identical_and_actions_equal_to_the_old_layer(detected, name):
    """Sampling is bit for bit the old layer's; acting equals it to round-off.

    ``act`` now moves parts past commuting ones (phases, ``elements._schedule``), so
    a weight can meet its factors in another order: equal to a few ulps, not bits.
    """
    model, _, spec = detected(name)
    sd = _state(model)
    for seed, kw in [(0, {}), (1, {"scale": (0.5, 2.0)}), (2, {"moving": True, "flip": True})]:
        new, old = sample(spec, seed=seed, **kw), legacy_act.sample(spec, seed=seed, **kw)
        assert len(new.components) == len(old.components)
        for (i, a), (j, b) in zip(new.components, old.components, strict=True):
            assert i == j and _equal(a, b), spec.groups[i].kind
        for g in (new, new.inverse()):
            a, b = act(spec, g, sd), legacy_act.act(spec, legacy_act.GroupElement(*_fields(g)), sd)
            assert set(a) == set(b)
            for k in a:
                torch.testing.assert_close(a[k], b[k], rtol=1e-14, atol=0, msg=k)


@pytest.mark.parametrize("name", FAST)
def test_phased_action_equals_acting_part_by_part(detected, name):
    """The phases of ``act`` reorder only commuting parts: the same as one part at a time."""
    model, _, spec = detected(name)
    sd = _state(model)
    g = sample(spec, seed=3, moving=True, flip=True)
    one_by_one = sd
    for comp in g.components:
        one_by_one = act(spec, GroupElement((comp,)), one_by_one)
    together = act(spec, g, sd)
    for k in together:
        torch.testing.assert_close(together[k], one_by_one[k], rtol=1e-13, atol=0, msg=k)
    kinds = [spec.groups[i].kind for i, _ in g.components]
    phases = elements._schedule(spec, g)
    assert sum(len(parts) for _, parts in phases) == len(kinds)
    norms, shifts = kinds.count("norm_scaling"), kinds.count("translation")
    assert len(phases) <= 1 + 2 * (norms + shifts)  # what acting in order takes at most
    if norms + shifts == 0:
        assert len(phases) == 1  # one act_chain
    if norms > 1 and shifts == 0:  # BatchNorm scalings move past parts on other classes
        assert len(phases) < 1 + 2 * norms


def _fields(g: GroupElement):
    return g.components, g.inverted


@pytest.mark.parametrize("name", ["mlp-relu", "residual-cnn", "tiny-transformer", "radial"])
def test_compose_and_inverse_obey_the_group_laws(detected, name):
    model, _, spec = detected(name)
    sd = _state(model)
    a, b = sample(spec, seed=0, scale=(0.5, 2)), sample(spec, seed=1, scale=(0.5, 2))
    for (i, va), (_, vb) in zip(a.components, b.components, strict=True):
        group = spec.groups[i]
        kind = kind_of(group)
        one = act(spec, GroupElement(((i, kind.compose(group, va, vb)),)), sd)
        two = act(spec, GroupElement(((i, vb), (i, va))), sd)
        back = act(
            spec,
            GroupElement(((i, kind.inverse(group, va)),)),
            act(spec, GroupElement(((i, va),)), sd),
        )
        for k in sd:
            if sd[k].is_floating_point():
                assert torch.allclose(one[k], two[k], rtol=1e-10, atol=1e-12), (group.kind, k)
                assert torch.allclose(back[k], sd[k], rtol=1e-10, atol=1e-12), (group.kind, k)


@pytest.mark.parametrize("name", ["tiny-transformer", "tiny-transformer-rotary", "residual-cnn"])
def test_identity_acts_as_the_identity(detected, name):
    model, _, spec = detected(name)
    sd = _state(model)
    ident = GroupElement(
        tuple((i, kind_of(g).identity(spec, g)) for i, g in enumerate(spec.groups))
    )
    assert _close(act(spec, ident, sd), sd, tol=1e-14)


def test_kind_table():
    assert set(KIND_CLASSES) == {
        "permutation",
        "sign",
        "scaling",
        "norm_scaling",
        "gl",
        "orthogonal",
        "translation",
        "module_permutation",
    }
    assert set(kinds_where(continuous=True)) == {
        "scaling",
        "norm_scaling",
        "gl",
        "orthogonal",
        "translation",
    }
    assert set(kinds_where(diagonal=True)) == {"scaling", "norm_scaling", "sign"}
    assert set(kinds_where(matrix=True)) == {"gl", "orthogonal"}
    with pytest.raises(ValueError, match="unknown group kind"):
        kind_of("rotation")


LAWS = ["mlp-relu", "residual-cnn", "tiny-transformer", "tiny-transformer-rotary", "radial"]


def _close(a: dict, b: dict, tol=1e-9) -> bool:
    return all(
        torch.allclose(a[k], b[k], rtol=tol, atol=tol) for k in a if a[k].is_floating_point()
    )


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(LAWS), s1=st.integers(0, 10**6), s2=st.integers(0, 10**6))
def test_action_is_a_group_action_for_all_elements(detected, name, s1, s2):
    model, _, spec = detected(name)
    sd = _state(model)
    a, b = sample(spec, seed=s1, scale=(0.3, 3)), sample(spec, seed=s2, scale=(0.3, 3))
    kinds = [kind_of(spec.groups[i]) for i, _ in a.components]
    ab = GroupElement(
        tuple(
            (i, k.compose(spec.groups[i], va, vb))
            for k, (i, va), (_, vb) in zip(kinds, a.components, b.components, strict=True)
        )
    )
    # components of different groups need not commute: compose group by group, one at a time
    for (i, va), (_, vb), (_, vab) in zip(a.components, b.components, ab.components, strict=True):
        one = act(spec, GroupElement(((i, vab),)), sd)
        two = act(spec, GroupElement(((i, va),)), act(spec, GroupElement(((i, vb),)), sd))
        assert _close(one, two), spec.groups[i].kind
    assert _close(act(spec, a.inverse(), act(spec, a, sd)), sd)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(LAWS), seed=st.integers(0, 10**6), s=st.floats(-1, 1))
def test_exp_is_a_one_parameter_subgroup(detected, name, seed, s):
    from wsym.group.generators import continuous_groups

    _, _, spec = detected(name)
    gen = torch.Generator().manual_seed(seed)
    for g in continuous_groups(spec):
        a = 0.5 * torch.randn(g.shape, generator=gen, dtype=torch.float64)
        whole = g.exp((s + 0.25) * a)
        parts = g.kind.compose(g.group, g.exp(s * a), g.exp(0.25 * a))
        # exponentials of O(1) matrices: round-off reaches ~1e-11 on zero entries
        tol = 1e-10 * max(1.0, float(whole.abs().max()))
        assert torch.allclose(whole, parts, rtol=1e-10, atol=tol), g.group.kind
        assert torch.allclose(
            g.kind.compose(g.group, g.exp(a), g.exp(-a)), g.exp(0 * a), atol=tol
        ), g.group.kind


def test_act_keeps_the_state_dicts_metadata(detected):
    model, _, spec = detected("mlp-relu")
    sd = model.state_dict()
    moved = act(spec, sample(spec, seed=0), sd)
    assert moved._metadata == sd._metadata
    copy.deepcopy(model).load_state_dict(moved)  # a copy: the registry's model stays as it is
