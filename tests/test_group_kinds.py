"""The kind classes against the element layer they replaced, and the group laws.

Same seeds give the same elements, bit for bit, and acting gives the same state
dicts as the frozen pre-redesign implementation (:mod:`legacy_act`); compose and
inverse obey the group laws on every kind.
"""

import legacy_act
import pytest
import torch
from cases import CASES

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
def test_elements_and_actions_are_bit_identical_to_the_old_layer(detected, name):
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
                assert torch.equal(a[k], b[k]), k


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


def test_kind_table():
    assert set(KIND_CLASSES) == {
        "permutation",
        "sign",
        "scaling",
        "norm_scaling",
        "gl",
        "orthogonal",
        "translation",
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
