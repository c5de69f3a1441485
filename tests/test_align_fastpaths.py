"""The fast paths of alignment against their plain references (float64).

Memoized block plans against :func:`wsym.group.layout.transform`, the incremental
pairing score against the full product, the reduced assignment and the argmax
certificate against brute force (ties included), over-relaxed balancing
against plain sweeps, and weight matching with and without score updates.
"""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment
from test_canon import double

import wsym
from wsym.align import canonicalize as canonical_forms
from wsym.align import matching
from wsym.align.alignment import NO_PERMUTATION
from wsym.align.assignment import MARGIN, assignment, diagonal_reduced, dominant_assignment, reduced
from wsym.align.canonicalize import canonical_element
from wsym.align.matching import plain_score, weight_matching
from wsym.group.elements import GroupElement, act
from wsym.group.layout import map_blocks, transform
from wsym.group.spec import leaves
from wsym.group.units import unit_matrix, unit_sums
from wsym.models.networks import MLP

CASES = ["mlp-relu", "residual-cnn", "tiny-transformer", "gqa", "concat", "bert"]


def _value(score, perm) -> float:
    return float(score[torch.arange(len(perm)), perm].sum())


def _brute_force(score) -> float:
    n = len(score)
    return max(_value(score, torch.tensor(p)) for p in itertools.permutations(range(n)))


@pytest.mark.parametrize("name", CASES)
def test_block_plans_visit_the_blocks_transform_visits(detected, name):
    _, _, spec = detected(name)
    gen = torch.Generator().manual_seed(0)
    for key, trees in spec.layouts:
        t = torch.randn(tuple(tr.size for tr in trees), generator=gen, dtype=torch.float64)

        def fn(block, lv):  # depends on the block's leaves and position: any mix-up shows
            code = sum((i + 1) * (leaf.cls + 2) * (leaf.var + 3) for i, leaf in enumerate(lv))
            return block * code + torch.arange(block.numel()).reshape(block.shape)

        assert torch.equal(map_blocks(spec, key, t, fn), transform(t, list(trees), fn)), key


@pytest.mark.parametrize("name", CASES)
def test_units_read_the_blocks_transform_visits(detected, name):
    _, _, spec = detected(name)
    sd = double(spec.act(spec.sample(seed=3), {k: v for k, v in _state(detected, name).items()}))
    layout = spec.layout
    for g in spec.groups:
        if g.kind == "permutation":
            cols = []
            for key, trees in spec.layouts:
                if key in spec.buffers:
                    continue

                def grab(block, lv, cls=g.cls, cols=cols):
                    axes = [i for i, leaf in enumerate(lv) if leaf.cls == cls]
                    if axes:
                        cols.append(block.movedim(axes[0], 0).reshape(block.shape[axes[0]], -1))
                    return block

                if any(leaf.cls == g.cls for tr in trees for leaf in leaves(tr)):
                    transform(sd[key], list(layout[key]), grab)
            assert torch.equal(unit_matrix(spec, sd, g.cls), torch.cat(cols, dim=1))
        if g.kind == "scaling":
            exps = dict(g.exponents)
            ref: dict = {}
            for key in g.params:

                def add(block, lv, g=g, exps=exps, ref=ref):
                    for ax, leaf in enumerate(lv):
                        e = exps.get(leaf.var, 0)
                        if leaf.cls == g.cls and e:
                            rows = block.movedim(ax, 0).reshape(block.shape[ax], -1)
                            ref[e] = ref.get(e, 0) + (rows * rows).sum(1)
                    return block

                if key not in spec.buffers:
                    transform(sd[key], list(layout[key]), add)
            got = unit_sums(spec, sd, g)
            assert got.keys() == ref.keys()
            for e in got:
                torch.testing.assert_close(got[e], ref[e], rtol=1e-14, atol=0)


def _state(detected, name):
    model, _, _ = detected(name)
    return {k: v.detach() for k, v in model.state_dict().items()}


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 12),
    features=st.integers(1, 30),
    seed=st.integers(0, 2**31 - 1),
    changed=st.floats(0.0, 1.0),
)
def test_updated_plain_score_is_the_product(n, features, seed, changed):
    gen = torch.Generator().manual_seed(seed)
    ref, old = torch.randn(2, n, features, generator=gen, dtype=torch.float64)
    cur = old.clone()
    cols = torch.rand(features, generator=gen) < changed
    cur[:, cols] = torch.randn(n, int(cols.sum()), generator=gen, dtype=torch.float64)
    full = ref @ cur.T
    torch.testing.assert_close(plain_score(ref, cur, (old, ref @ old.T)), full, rtol=0, atol=1e-12)
    torch.testing.assert_close(plain_score(ref, cur), full, rtol=0, atol=0)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    levels=st.integers(1, 4),
    warm=st.booleans(),
)
def test_reduced_assignment_is_optimal_with_ties(n, seed, levels, warm):
    """Few distinct values (ties everywhere): the answer is still a maximizer."""
    gen = torch.Generator().manual_seed(seed)
    score = torch.randint(0, levels, (n, n), generator=gen).double() * 0.7 + 3.0
    perm = assignment(score, warm=warm)
    assert sorted(perm.tolist()) == list(range(n))
    assert _value(score, perm) == pytest.approx(_brute_force(score), abs=1e-12)
    for matrix in (reduced(score), diagonal_reduced(score)):
        _, col = linear_sum_assignment(matrix.numpy(), maximize=True)
        assert _value(score, torch.as_tensor(col)) == pytest.approx(_brute_force(score), abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 2**31 - 1), diag=st.floats(0.0, 3.0))
def test_diagonal_reduction_keeps_the_maximizers(n, seed, diag):
    """Row and column constants only; the warm answer has the optimal value."""
    gen = torch.Generator().manual_seed(seed)
    score = torch.randn(n, n, generator=gen, dtype=torch.float64) + diag * torch.eye(n)
    shift = diagonal_reduced(score) - score  # must be a_i + b_j
    torch.testing.assert_close(shift, shift[:, :1] + shift[:1, :] - shift[0, 0], rtol=0, atol=1e-12)
    _, col = linear_sum_assignment(score.numpy(), maximize=True)
    best = _value(score, torch.as_tensor(col))
    assert _value(score, assignment(score, warm=True)) == pytest.approx(best, abs=1e-9)


def test_diagonal_reduction_makes_an_optimal_identity_tight():
    """Converged potentials: every diagonal entry is its row's maximum (zero)."""
    gen = torch.Generator().manual_seed(3)
    score = torch.randn(30, 30, generator=gen, dtype=torch.float64)
    _, col = linear_sum_assignment(score.numpy(), maximize=True)
    score = score[:, torch.as_tensor(col)]  # now the identity is the optimum
    matrix = diagonal_reduced(score, passes=30)
    torch.testing.assert_close(matrix.diagonal(), torch.zeros(30, dtype=torch.float64))
    assert float(matrix.max()) <= 1e-12


def _old_dominant(score):
    """The previous top-2 implementation of the certificate (reference)."""
    n = score.shape[0]
    if n == 1:
        return torch.zeros(1, dtype=torch.long)
    margin = MARGIN * float(score.abs().max())
    for dim in (1, 0):
        top = score.topk(2, dim=dim)
        first, second = top.values.select(dim, 0), top.values.select(dim, 1)
        best = top.indices.select(dim, 0)
        if bool((first - second > margin).all()) and torch.unique(best).numel() == n:
            if dim == 1:
                return best
            perm = torch.empty(n, dtype=torch.long)
            perm[best] = torch.arange(n)
            return perm
    return None


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    diag=st.floats(0.0, 4.0),
    levels=st.integers(0, 3),
)
def test_argmax_certificate_is_the_unique_optimum_and_agrees_with_top2(n, seed, diag, levels):
    gen = torch.Generator().manual_seed(seed)
    if levels:  # ties
        score = torch.randint(0, levels + 1, (n, n), generator=gen).double()
    else:
        score = torch.randn(n, n, generator=gen, dtype=torch.float64)
    score = score + diag * torch.eye(n, dtype=torch.float64)[torch.randperm(n, generator=gen)]
    fast, old = dominant_assignment(score), _old_dominant(score)
    assert (fast is None) == (old is None)
    if fast is not None:
        assert torch.equal(fast, old)
        best = _brute_force(score)
        assert _value(score, fast) == pytest.approx(best, abs=1e-12)
        others = [
            _value(score, torch.tensor(p))
            for p in itertools.permutations(range(n))
            if list(p) != fast.tolist()
        ]
        gap = 1e-12 * float(score.abs().max())  # relative: a diagonal of 1e-33 certifies too
        assert all(v < best - gap for v in others)


@pytest.mark.parametrize("name", ["mlp-relu", "residual-cnn", "tiny-transformer", "swiglu"])
def test_over_relaxed_balancing_reaches_the_plain_fixed_point(detected, name, monkeypatch):
    _, _, spec = detected(name)
    sd = double(spec.act(spec.sample(seed=5), _state(detected, name)))
    fast, _ = canonical_element(sd, spec, kinds=NO_PERMUTATION)
    monkeypatch.setattr(canonical_forms, "OVER_RELAXATION", {})
    plain, _ = canonical_element(sd, spec, kinds=NO_PERMUTATION)
    for k in sd:
        if sd[k].is_floating_point():
            scale = float(plain[k].abs().max().clamp_min(1e-300))
            assert float((fast[k] - plain[k]).abs().max()) <= 1e-9 * scale, k


@pytest.mark.parametrize("seed", range(3))
def test_weight_matching_with_score_updates_equals_full_products(seed, monkeypatch):
    """A wide pair far apart: many sweeps, each class's score updated from its last solve."""
    torch.manual_seed(seed)
    mlp = MLP(8, [24, 24, 24], 3)
    spec = wsym.detect(mlp, torch.randn(2, 8))
    a = {k: v.double() for k, v in mlp.state_dict().items()}
    b = act(spec, spec.sample(seed=seed + 10, kinds=["permutation"]), a)
    b = {k: v + 0.8 * torch.randn_like(v) for k, v in b.items()}
    updated = weight_matching(spec, a, b)
    calls = []
    full = matching.plain_score

    def never_update(ref, cur, previous=None):
        calls.append(previous is not None)
        return full(ref, cur)

    monkeypatch.setattr(matching, "plain_score", never_update)
    plain = weight_matching(spec, a, b)
    assert any(calls)  # the descent did reach classes with a previous score
    moved_u = act(spec, GroupElement(tuple(updated)), b)
    moved_p = act(spec, GroupElement(tuple(plain)), b)
    assert all(torch.equal(moved_u[k], moved_p[k]) for k in b)


@pytest.mark.parametrize("name", ["mlp-relu", "residual-cnn", "tiny-transformer", "gqa", "bert"])
def test_folded_canonicalizing_element_still_maps_onto_the_canonical_form(detected, name):
    """Components folded across sweeps: ``act(g, sd)`` is the canonical form, ``g^-1`` undoes it."""
    _, _, spec = detected(name)
    sd = double(spec.act(spec.sample(seed=7), _state(detected, name)))
    canon, g = canonical_element(sd, spec, kinds=NO_PERMUTATION)
    groups = [i for i, _ in g.components]
    continuous = [i for i in groups if spec.groups[i].kind in ("scaling", "gl", "norm_scaling")]
    # sweeps folded in: at most a second component (a GL column-sign convention, or past a
    # translation of the same bias)
    assert len(continuous) <= 2 * len(set(continuous))
    moved, back = act(spec, g, sd), act(spec, g.inverse(), canon)
    for k in sd:
        if sd[k].is_floating_point():
            torch.testing.assert_close(moved[k], canon[k], rtol=1e-9, atol=1e-12 * _size(canon))
            torch.testing.assert_close(back[k], sd[k], rtol=1e-9, atol=1e-12 * _size(sd))


def _size(sd) -> float:
    return max(float(v.abs().max()) for v in sd.values() if v.is_floating_point() and v.numel())


@pytest.mark.parametrize("name", CASES)
def test_one_groups_tensors_acted_on_alone_are_what_act_gives(detected, name):
    from wsym.group.elements import acted_tensors

    _, _, spec = detected(name)
    sd = double(_state(detected, name))
    element = spec.sample(seed=5, scale=(0.5, 2.0))
    for i, value in element.components:
        whole = act(spec, GroupElement(((i, value),)), sd)
        alone = {**sd, **acted_tensors(spec, i, value, sd)}
        for key in sd:
            torch.testing.assert_close(alone[key], whole[key], rtol=1e-15, atol=0, msg=key)
