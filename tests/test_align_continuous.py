"""Continuous groups fitted to a reference: same function, objective never raised."""

import pytest
import torch
from cases import BY_NAME
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_canon import double
from test_detect import as_float64, outputs

import wsym
from wsym.align.biases import unmatched_biases, without
from wsym.align.continuous import best_scales, fit_continuous, gl_objective, mismatch
from wsym.align.matching import weight_matching
from wsym.group.elements import GroupElement, act

CASES = ["mlp-relu", "residual-cnn", "tiny-transformer", "bert"]


def independent(name):
    """A second, independently initialized state dict of the case's architecture."""
    torch.manual_seed(1)
    return double(BY_NAME[name].build().state_dict())


@pytest.mark.parametrize("name", CASES)
def test_reference_alignment_keeps_the_function_and_lowers_the_objective(detected, name):
    model, inputs, spec = detected(name)
    ref, other = double(model.state_dict()), independent(name)
    aligned = wsym.align(ref, other, spec)
    net, x = as_float64(model, inputs)
    before, after = outputs(net, other, x), outputs(net, aligned, x)
    assert float((after - before).abs().max()) <= 1e-9 * float(before.abs().max())
    # the default's permutation step scores without the unmatched biases (wsym.align.biases)
    left_out = unmatched_biases(spec)
    perms = weight_matching(spec, without(ref, left_out), without(other, left_out))
    perms_only = act(spec, GroupElement(tuple(perms)), other)
    assert mismatch(spec, ref, aligned) <= mismatch(spec, ref, perms_only) * (1 + 1e-12)
    assert mismatch(spec, ref, aligned) <= mismatch(spec, ref, other) * (1 + 1e-12)
    matched = wsym.align(ref, other, spec, biases="matched")
    every = act(spec, GroupElement(tuple(weight_matching(spec, ref, other))), other)
    assert mismatch(spec, ref, matched) <= mismatch(spec, ref, every) * (1 + 1e-12)
    assert mismatch(spec, ref, every) <= mismatch(spec, ref, other) * (1 + 1e-12)


@pytest.mark.parametrize("name", CASES)
def test_continuous_fit_recovers_a_continuously_moved_copy(detected, name):
    model, _, spec = detected(name)
    sd = double(model.state_dict())
    continuous = [g.kind for g in spec.groups if g.continuous]
    moved = spec.act(spec.sample(seed=3, scale=(0.5, 2.0), kinds=continuous), sd)
    back = act(spec, GroupElement(tuple(fit_continuous(spec, sd, moved))), moved)
    assert mismatch(spec, sd, back) <= 1e-6 * mismatch(spec, sd, moved)


@pytest.mark.parametrize("name", ["mlp-relu", "tiny-transformer"])
def test_canonical_then_reference_recovers_copies_rescaled_by_orders_of_magnitude(detected, name):
    model, _, spec = detected(name)
    sd = double(model.state_dict())
    moved = spec.act(spec.sample(seed=7, scale=(1e-2, 1e2)), sd)
    back = wsym.align(sd, moved, spec, continuous="canonical+reference")
    assert mismatch(spec, sd, back) <= 1e-12 * mismatch(spec, sd, moved)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.1, 10.0), min_size=2, max_size=2),
    st.lists(st.floats(-10.0, 10.0), min_size=2, max_size=2),
    st.sampled_from([(1, -1), (1,), (2, -1), (1, -2)]),
)
def test_best_scale_is_the_global_minimum_on_a_grid(squares, inner, exps):
    assume(min(exps) < 0 or inner[0] > 0.1)  # else the infimum is at s -> 0, not attained
    a = {e: torch.tensor([squares[i]], dtype=torch.float64) for i, e in enumerate(exps)}
    b = {e: torch.tensor([inner[i]], dtype=torch.float64) for i, e in enumerate(exps)}

    def objective(s):
        return sum(a[e] * s ** (2 * e) - 2 * b[e] * s**e for e in exps)

    s = best_scales(a, b)
    grid = torch.logspace(-3, 3, 20001, dtype=torch.float64)
    assert float(s) > 0
    assert float(objective(s)) <= float(objective(grid).min()) + 1e-9
    assert float(objective(s)) <= float(objective(torch.ones(1, dtype=torch.float64))) + 1e-12


def test_gl_fit_lowers_each_heads_objective():
    from wsym.align.continuous import _fit_gl

    gen = torch.Generator().manual_seed(0)
    g, h = (torch.randn(3, 10, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    m = torch.randn(3, 4, 4, generator=gen, dtype=torch.float64) + 2 * torch.eye(4)
    g_ref, h_ref = g @ m, h @ torch.linalg.inv(m).transpose(-1, -2)
    eye = torch.eye(4, dtype=torch.float64).expand(3, 4, 4)
    mats, refs = {0: g, 1: h}, {0: g_ref, 1: h_ref}
    fit = eye.clone()
    for _ in range(20):  # fit_continuous calls it once per sweep, each from the last result
        step = _fit_gl({0: g @ fit, 1: h @ torch.linalg.inv(fit).transpose(-1, -2)}, refs)
        if step is None:
            break
        fit = fit @ step
    start = gl_objective(eye, *mats.values(), *refs.values())
    end = gl_objective(fit, *mats.values(), *refs.values())
    assert (end < 1e-8 * start).all()


def test_balanced_procrustes_undoes_a_planted_gl_element_and_never_loses_to_the_identity():
    from wsym.align.continuous import _fit_gl, balanced_procrustes, balancing

    gen = torch.Generator().manual_seed(1)
    g, h = (torch.randn(3, 12, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    b = balancing(g, h)
    g0, h0 = g @ b, h @ torch.linalg.inv(b).transpose(-1, -2)
    assert torch.allclose(g0.mT @ g0, h0.mT @ h0, atol=1e-10)
    m = torch.randn(3, 4, 4, generator=gen, dtype=torch.float64)
    g_ref, h_ref = g @ m, h @ torch.linalg.inv(m).mT
    assert torch.allclose(balanced_procrustes(g, h, g_ref, h_ref), m, atol=1e-8)
    noisy = g_ref + 0.5 * torch.randn(g_ref.shape, generator=gen, dtype=torch.float64)
    step = _fit_gl({0: g, 1: h}, {0: noisy, 1: h_ref})
    eye = torch.eye(4, dtype=torch.float64).expand(3, 4, 4)
    assert step is not None
    assert (gl_objective(step, g, h, noisy, h_ref) <= gl_objective(eye, g, h, noisy, h_ref)).all()


def test_scale_change_is_the_change_acting_measures(detected):
    """The closed-form per-unit change of a BatchNorm scaling against acting (float64)."""
    from wsym.align.continuous import acted_change, scale_change
    from wsym.group.units import unit_moments, unit_sums

    model, _, spec = detected("residual-cnn")
    gen = torch.Generator().manual_seed(2)
    ref = double(model.state_dict())
    cur = {
        k: torch.randn(v.shape, generator=gen, dtype=v.dtype) if v.is_floating_point() else v
        for k, v in ref.items()
    }
    for key in spec.buffers:  # variances near eps: the BatchNorm weight's correction matters
        if key.endswith("running_var"):
            cur[key] = torch.rand(cur[key].shape, generator=gen, dtype=torch.float64) * 1e-4
    groups = [i for i, g in enumerate(spec.groups) if g.kind in ("norm_scaling", "scaling")]
    assert any(spec.groups[i].corrections for i in groups)
    for i in groups:
        g = spec.groups[i]
        squares, inner = unit_moments(spec, cur, ref, g)
        assert squares.keys() == unit_sums(spec, cur, g).keys() == inner.keys()
        assert all(torch.equal(squares[e], unit_sums(spec, cur, g)[e]) for e in squares)
        s = torch.exp(torch.randn(g.size, generator=gen, dtype=torch.float64))
        fast, slow = scale_change(spec, i, ref, cur, s), acted_change(spec, i, ref, cur, s)
        torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-9 * float(slow.abs().max()))
