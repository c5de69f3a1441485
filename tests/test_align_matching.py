"""Weight matching against a plain coordinate-descent reference; Procrustes on GL blocks."""

import random

import pytest
import torch
from scipy.optimize import linear_sum_assignment
from test_canon import double

import wsym
from wsym.align.alignment import NO_PERMUTATION, procrustes, weight_matching
from wsym.align.canonicalize import canonical_element
from wsym.align.matching import ROTATION_TOL
from wsym.group.elements import GroupElement, act
from wsym.group.units import block_matrices, odd_rows, unit_matrix
from wsym.testing import perturbed

CASES = ["mlp-relu", "mlp-tanh", "residual-cnn", "tiny-transformer", "gqa", "concat"]


def plain_score(spec, ref, current, i):
    """Pairing scores of permutation group ``i``: signs and head rotations maximized inside."""
    cls = spec.groups[i].cls
    full = unit_matrix(spec, ref, cls) @ unit_matrix(spec, current, cls).T
    score, odds = full.clone(), {}
    for j, g in enumerate(spec.groups):
        if g.kind == "sign" and g.cls == cls:
            odds[j] = odd_rows(spec, ref, g) @ odd_rows(spec, current, g).T
            score += odds[j].abs() - odds[j]
        if g.kind in ("gl", "orthogonal") and g.index == (cls,):
            r, c = block_matrices(spec, ref, g), block_matrices(spec, current, g)
            for a in range(len(score)):
                for b in range(len(score)):
                    cross = sum(c[p][b].T @ r[p][a] for p in r)
                    u, sv, vh = torch.linalg.svd(cross)
                    best = sv.sum()
                    if g.special and torch.linalg.det(u @ vh) < 0:
                        best = best - 2 * sv[-1]
                    score[a, b] += best - cross.trace()
    return score, full, odds


def reference_weight_matching(spec, ref, other, max_iter=100, seed=0):
    """Git Re-Basin's loop, as plainly as possible: every class solved in every sweep."""
    groups = [i for i, g in enumerate(spec.groups) if g.kind == "permutation"]
    rng = random.Random(seed)
    current = other
    for _ in range(max_iter):
        changed = False
        order = groups[:]
        rng.shuffle(order)
        for i in order:
            score, full, odds = plain_score(spec, ref, current, i)
            perm = torch.as_tensor(linear_sum_assignment(score.numpy(), maximize=True)[1])
            rows = torch.arange(len(perm))
            gain = float(score[rows, perm].sum() - score.trace())
            if gain <= 1e-12 * max(1.0, float(full.trace().abs())):
                perm = rows
            step = [(i, perm)] if (perm != rows).any() else []
            for j, odd in odds.items():
                flips = torch.where(odd[rows, perm] < 0, -1.0, 1.0).double()
                if (flips < 0).any():
                    step.append((j, flips))
            if step:
                current = act(spec, GroupElement(tuple(step)), current)
                changed = True
        turn = procrustes(spec, ref, current, tol=ROTATION_TOL)
        if turn:
            current = act(spec, GroupElement(tuple(turn)), current)
            changed = True
        if not changed:
            break
    return current


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_weight_matching_equals_the_plain_loop(detected, name, seed):
    """Skipping classes whose cost cannot have changed gives the same permutations."""
    model, _, spec = detected(name)
    sd = double(model.state_dict())
    noisy = perturbed(sd, 0.5, seed)
    moved = spec.act(spec.sample(seed=seed, kinds=["permutation", "sign"]), noisy)
    ref, _ = canonical_element(sd, spec, kinds=NO_PERMUTATION)
    other, _ = canonical_element(moved, spec, kinds=NO_PERMUTATION)
    fast = act(spec, GroupElement(tuple(weight_matching(spec, ref, other, seed=seed))), other)
    slow = reference_weight_matching(spec, ref, other, seed=seed)
    for k in slow:
        if slow[k].is_floating_point():
            torch.testing.assert_close(fast[k], slow[k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("name", ["tiny-transformer", "tiny-transformer-rotary", "gqa"])
def test_procrustes_undoes_a_rotation_and_never_moves_blocks_apart(detected, name):
    model, _, spec = detected(name)
    sd, _ = canonical_element(double(model.state_dict()), spec, kinds=NO_PERMUTATION)
    gl = [i for i, g in enumerate(spec.groups) if g.kind in ("gl", "orthogonal")]
    gen = torch.Generator().manual_seed(0)
    comps = []
    for i in gl:
        g = spec.groups[i]
        shape = next(iter(block_matrices(spec, sd, g).values())).shape[:-2]
        q, _ = torch.linalg.qr(torch.randn(*shape, g.size, g.size, generator=gen).double())
        if g.special:
            q[..., :, 0] *= torch.linalg.det(q).sign().unsqueeze(-1)
        comps.append((i, q))
    rotated = act(spec, GroupElement(tuple(comps)), sd)
    back = act(spec, GroupElement(tuple(procrustes(spec, sd, rotated))), rotated)
    for k in sd:
        if sd[k].is_floating_point():
            torch.testing.assert_close(back[k], sd[k], rtol=1e-9, atol=1e-9, msg=k)
    # Two unrelated networks: the rotation never increases the block distance.
    noisy = {
        k: v + v.abs().mean() * torch.randn(v.shape, generator=gen, dtype=v.dtype)
        if v.is_floating_point()
        else v
        for k, v in sd.items()
    }
    turned = act(spec, GroupElement(tuple(procrustes(spec, sd, noisy))), noisy)
    for i in gl:
        g = spec.groups[i]
        before = sum(
            float(((block_matrices(spec, noisy, g)[p] - m) ** 2).sum())
            for p, m in block_matrices(spec, sd, g).items()
        )
        after = sum(
            float(((block_matrices(spec, turned, g)[p] - m) ** 2).sum())
            for p, m in block_matrices(spec, sd, g).items()
        )
        assert after <= before + 1e-9 * before


def test_align_result_is_unchanged_by_the_fast_path_on_an_mlp_pair():
    """Two independently initialized MLPs: wsym.align equals the plain loop end to end."""
    torch.manual_seed(0)
    a, b = wsym.models.networks.MLP(6, [9, 7], 3), wsym.models.networks.MLP(6, [9, 7], 3)
    spec = wsym.detect(a, torch.randn(4, 6))
    sd_a, sd_b = double(a.state_dict()), double(b.state_dict())
    ref, g_ref = canonical_element(sd_a, spec, kinds=NO_PERMUTATION)
    other, _ = canonical_element(sd_b, spec, kinds=NO_PERMUTATION)
    slow = act(spec, g_ref.inverse(), reference_weight_matching(spec, ref, other))
    fast = wsym.align(sd_a, sd_b, spec, continuous="canonical")
    for k in slow:
        torch.testing.assert_close(fast[k], slow[k], rtol=1e-12, atol=1e-12, msg=k)


def test_every_layernorm_sign_group_of_the_residual_stream_is_matched(detected):
    """A transformer's residual stream carries one sign group per LayerNorm: each is matched."""
    model, _, spec = detected("tiny-transformer")
    sd, _ = canonical_element(double(model.state_dict()), spec, kinds=NO_PERMUTATION)
    signs = [i for i, g in enumerate(spec.groups) if g.kind == "sign"]
    assert len({spec.groups[i].cls for i in signs}) < len(signs)  # several on one class
    gen = torch.Generator().manual_seed(0)
    flips = tuple(
        (i, torch.randint(0, 2, (spec.groups[i].size,), generator=gen).double() * 2 - 1)
        for i in signs
    )
    moved = act(spec, GroupElement(flips), sd)
    back = act(spec, GroupElement(tuple(weight_matching(spec, sd, moved))), moved)
    for k in sd:
        if sd[k].is_floating_point():
            torch.testing.assert_close(back[k], sd[k], rtol=0, atol=1e-12, msg=k)


def test_sign_groups_no_permutation_acts_on_are_flipped_back():
    """A spec whose class keeps its signs but not its permutation (here dropped by hand,
    as an embedding read through shifted copies is): weight matching flips them back."""
    import dataclasses

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 5), torch.nn.Tanh(),
        torch.nn.Linear(5, 2),
    ).double()  # fmt: skip
    full = wsym.detect(mlp, torch.randn(4, 3, dtype=torch.float64))
    lone = min(g.cls for g in full.groups if g.kind == "permutation")
    keep = [i for i, g in enumerate(full.groups) if not (g.kind == "permutation" and g.cls == lone)]
    spec = dataclasses.replace(
        full,
        groups=tuple(full.groups[i] for i in keep),
        deviations=tuple(full.deviations[i] for i in keep) if full.deviations else (),
    )
    sd = mlp.state_dict()
    moved = spec.act(spec.sample(seed=0, kinds=["sign"]), sd)
    assert any(not torch.equal(moved[k], sd[k]) for k in sd)
    back = act(spec, GroupElement(tuple(weight_matching(spec, sd, moved))), moved)
    assert all(torch.equal(back[k], sd[k]) for k in sd)


class DepthwiseGate(torch.nn.Module):
    """GhostNetV2's attention branch in small: 1x1 conv, then two depthwise convs, each
    followed by a BatchNorm, then a sigmoid gate scaled per channel by a fixed profile
    (which keeps the channels from being permuted). Each BatchNorm's sign group meets
    the next one's on the same channel's entries."""

    def __init__(self, width=6):
        super().__init__()
        conv, bn = torch.nn.Conv2d, torch.nn.BatchNorm2d
        dw = {"groups": width, "bias": False}
        self.chain = torch.nn.Sequential(
            conv(3, width, 1, bias=False), bn(width),
            conv(width, width, (1, 3), padding=(0, 1), **dw), bn(width),
            conv(width, width, (3, 1), padding=(1, 0), **dw), bn(width),
        )  # fmt: skip
        self.head = torch.nn.Linear(width, 2)

    def forward(self, x):
        gate = torch.sigmoid(self.chain(x)).mean((2, 3))
        profile = torch.linspace(1.0, 2.0, gate.shape[1], dtype=gate.dtype)
        return self.head(gate * profile)


def test_overlapping_sign_groups_of_an_unpermuted_class_are_flipped_back_together():
    torch.manual_seed(0)
    model = DepthwiseGate().double().eval()
    for bn in (m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)):
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
    spec = wsym.detect(model, torch.randn(2, 3, 5, 5, dtype=torch.float64))
    chain = {g.cls for g in spec.groups if any(p.startswith("chain.2") for p in g.params)}
    signs = [g for g in spec.groups if g.kind == "sign" and g.cls in chain]
    assert len(signs) >= 3 and not any(
        g.kind == "permutation" and g.cls in chain for g in spec.groups
    )
    sd = model.state_dict()
    for seed in range(4):
        moved = spec.act(spec.sample(seed=seed, kinds=["sign"]), sd)
        assert any(not torch.equal(moved[k], sd[k]) for k in sd)
        back = act(spec, GroupElement(tuple(weight_matching(spec, sd, moved))), moved)
        for k in sd:
            if sd[k].is_floating_point():
                torch.testing.assert_close(back[k], sd[k], rtol=0, atol=1e-12, msg=k)
