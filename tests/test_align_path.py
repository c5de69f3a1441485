"""refine='path': the continuous groups fitted to the loss along the interpolation path."""

import pytest
import torch
from test_align_residual import PRE_LN, batches, folded, pair
from test_canon import double
from test_detect import as_float64, outputs

import wsym
from wsym.align import path
from wsym.errors import WsymInputError
from wsym.group.elements import GroupElement, act


def distillation(model, name, n=3):
    """Batches whose targets are ``model``'s own outputs, and the squared error to them."""
    with torch.no_grad():
        pairs = [(x, model(x)) for x, _ in batches(name, n)]
    return pairs, lambda out, target: (out - target).pow(2).mean()


def grid_loss(model, ref, other, pairs, loss_fn):
    """The mean loss over path.GRID, as the fit checks it (float32 forward passes)."""
    total = 0.0
    for t in path.GRID:
        state = {k: ((1 - t) * v + t * other[k]).float() for k, v in ref.items()}
        for x, y in pairs:
            out = torch.func.functional_call(model, state, (x,))
            total += float(loss_fn(out, y)) / (len(path.GRID) * len(pairs))
    return total


@pytest.mark.parametrize("residual", ["rotation", "permutation"])
@pytest.mark.parametrize("name", PRE_LN)
def test_path_refinement_keeps_the_function(detected, name, residual):
    model, inputs, spec = detected(name)
    ref, other = pair(model, name)
    pairs, loss_fn = distillation(model, name)
    aligned = wsym.align(
        ref,
        other,
        spec,
        "activations",
        residual=residual,
        refine="path",
        loss_fn=loss_fn,
        model=model,
        batches=pairs,
    )
    net, x = as_float64(model, inputs)
    before, after = outputs(net, other, x), outputs(net, aligned, x)
    assert float((after - before).abs().max()) <= 1e-9 * float(before.abs().max())


@pytest.mark.parametrize("name", PRE_LN)
def test_path_refinement_never_raises_the_path_loss(detected, name):
    model, _, spec = detected(name)
    ref, other = pair(model, name)
    pairs, loss_fn = distillation(model, name)
    options = {"residual": "rotation", "model": model, "batches": pairs}
    start = wsym.align(ref, other, spec, "activations", **options)
    refined = wsym.align(ref, other, spec, "activations", refine="path", loss_fn=loss_fn, **options)
    assert grid_loss(model, ref, refined, pairs, loss_fn) < grid_loss(
        model, ref, start, pairs, loss_fn
    )


def test_planted_continuous_element_is_undone_along_the_path(detected):
    """``other`` is ``ref`` moved by a rotation of the stream, GL heads and scales: the fit
    (gradient descent, no exact recovery claimed) brings the path loss, zero at
    ``g = planted^-1``, down at least fourfold (about ninefold here)."""
    name = "tiny-transformer"
    model, _, spec = detected(name)
    ref, _ = pair(model, name)
    frame, ref_f, _, _ = folded(spec, model, ref, ref)
    (i,) = frame.rotations
    gen = torch.Generator().manual_seed(3)
    n = frame.rotated.groups[i].size
    turn = path._exp(frame.rotated, i, 0.3 * torch.randn(n, n, generator=gen).double(), True)
    planted = act(frame.rotated, GroupElement(((i, turn),)), ref_f)
    small = wsym.group.elements.sample(
        frame.work, seed=2, scale=(0.7, 1.4), kinds=["gl", "scaling"]
    )
    planted = act(frame.work, small, planted)
    pairs, loss_fn = distillation(model, name)
    before = grid_loss(model, ref_f, planted, pairs, loss_fn)
    comps = path.path_fit(
        frame.rotated, model, ref_f, planted, pairs, loss_fn, centered=frozenset({i}), steps=300
    )
    after = grid_loss(
        model, ref_f, act(frame.rotated, GroupElement(tuple(comps)), planted), pairs, loss_fn
    )
    assert after <= 0.25 * before


def test_centered_rotations_fix_the_ones_vector(detected):
    model, _, spec = detected("tiny-transformer")
    frame, *_ = folded(spec, model, *pair(model, "tiny-transformer"))
    (i,) = frame.rotations
    n = frame.rotated.groups[i].size
    q = path._exp(frame.rotated, i, torch.randn(n, n, dtype=torch.float64), True)
    ones = torch.ones(n, dtype=torch.float64)
    assert torch.allclose(q.T @ q, torch.eye(n, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(q @ ones, ones, atol=1e-12)


def test_path_refinement_needs_targets(detected):
    """The loss along the path needs targets (the other refusals: test_align_residual)."""
    model, inputs, spec = detected("tiny-transformer")
    sd = double(model.state_dict())
    with pytest.raises(WsymInputError, match="batches of \\(inputs, targets\\)"):
        wsym.align(sd, sd, spec, refine="path", model=model, batches=[(inputs, None)])
