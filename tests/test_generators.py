"""Closed-form generators against automatic differentiation of the exact action (float64).

For every continuous group of the registry's models, ``J a`` equals
``torch.func.jvp`` of ``t -> exp(t a) . theta`` at ``t = 0``, ``J^T y`` equals the
``vjp`` of ``a -> exp(a) . theta`` at ``a = 0``, and ``<J a, y> = <a, J^T y>``.
"""

import pytest
import torch

from wsym.group.elements import GroupElement, act
from wsym.group.generators import continuous_groups, vertical, vertical_adjoint

NAMES = [
    "mlp-relu",
    "mlp-leaky",
    "linear-linear",
    "swiglu",
    "depthwise",
    "residual-cnn",
    "tiny-transformer",
    "tiny-transformer-rotary",
    "tiny-transformer-tokens",
    "diagonal-net",
    "concat",
    "group-norm",
    "radial",
    "rmsnorm-residual",
    "mha",
    "transformer-encoder-layer",
    "gqa",
    "bert",
    "llama",
    "e3nn-gate",
    pytest.param("resnet18", marks=pytest.mark.slow),
]


def _state(model, seed=0) -> dict:
    """Float64 state with running variances moved off 1 (the corrections then matter)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in model.state_dict().items():
        v = v.double() if v.is_floating_point() else v
        if k.endswith("running_var"):
            v = 0.1 + torch.rand(v.shape, generator=gen, dtype=torch.float64)
        out[k] = v
    return out


def _moved(spec, gens, state, keys):
    def f(a):
        moved = act(spec, GroupElement(((gens.index, gens.exp(a)),)), state)
        return tuple(moved[k] for k in keys)

    return f


@pytest.mark.parametrize("name", NAMES)
def test_generators_are_the_derivative_of_the_action(detected, name):
    model, _, spec = detected(name)
    state = _state(model)
    groups = continuous_groups(spec)
    assert groups or not any(g.continuous for g in spec.groups)
    gen = torch.Generator().manual_seed(1)
    for g in groups:
        a = torch.randn(g.shape, generator=gen, dtype=torch.float64)
        tangent = g.apply(state, a)
        keys = sorted(tangent)
        assert set(keys) == set(g.keys)
        assert any(float(v.abs().max()) > 0 for v in tangent.values()), g.group.kind
        f = _moved(spec, g, state, keys)
        zero = torch.zeros(g.shape, dtype=torch.float64)
        _, jvp = torch.func.jvp(lambda t, f=f, a=a: f(t * a), (torch.zeros(()),), (torch.ones(()),))
        for k, d in zip(keys, jvp, strict=True):
            scale = 1 + float(d.abs().max())
            assert float((tangent[k] - d).abs().max()) < 1e-12 * scale, (g.group.kind, k)
        y = {k: torch.randn(tangent[k].shape, generator=gen, dtype=torch.float64) for k in keys}
        back = g.adjoint(state, y)
        assert back.shape == zero.shape
        _, pull = torch.func.vjp(f, zero)
        (ref,) = pull(tuple(y[k] for k in keys))
        assert torch.allclose(back, ref, rtol=1e-12, atol=1e-12), g.group.kind
        lhs = sum(float((tangent[k] * y[k]).sum()) for k in keys)
        rhs = float((a * back).sum())
        assert abs(lhs - rhs) < 1e-12 * (1 + abs(lhs)), g.group.kind


def test_vertical_sums_the_groups(detected):
    model, _, spec = detected("tiny-transformer")
    state = _state(model)
    groups = continuous_groups(spec)
    assert {g.group.kind for g in groups} == {"gl", "scaling", "translation"}
    coeffs = {g.index: torch.randn(g.shape, dtype=torch.float64) for g in groups}
    total = vertical(spec, state, coeffs)
    for key, v in total.items():
        parts = [g.apply(state, coeffs[g.index]).get(key) for g in groups]
        assert torch.allclose(v, sum(p for p in parts if p is not None))
    y = {k: torch.randn_like(v) for k, v in total.items()}
    back = vertical_adjoint(spec, state, y)
    lhs = sum(float((v * y[k]).sum()) for k, v in total.items())
    assert abs(lhs - sum(float((coeffs[i] * b).sum()) for i, b in back.items())) < 1e-10
    with pytest.raises(TypeError, match="finite"):
        from wsym.group.kinds import kind_of

        perm = next(g for g in spec.groups if g.kind == "permutation")
        kind_of(perm).coefficient_shape(spec, perm)
