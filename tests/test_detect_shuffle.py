"""Channel shuffle: the whole S_C of the shuffled channels, through a relabeled class."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from cases import assert_group_laws, independent_deviation
from torch import nn
from torchvision.models.shufflenetv2 import channel_shuffle

import wsym
from wsym.errors import WsymInputError
from wsym.group.elements import GroupElement
from wsym.group.spec import Leaf, Split, SymmetrySpec

G, C = 3, 12
SIGMA = tuple(i * (C // G) + j for j in range(C // G) for i in range(G))  # position -> channel


class Shuffled(nn.Module):
    """conv (3 -> 12), ReLU (or none), a shuffle of 3 groups of 4, conv (12 -> 2).

    ``form``: ``"nn"`` (``nn.ChannelShuffle``), ``"tv"`` (torchvision's
    view/transpose/view), ``"cat"`` (the shuffle reads two concatenated
    convolutions, as in ShuffleNetV2), ``"residual"`` (shuffled channels added to
    the unshuffled ones: only permutations commuting with the shuffle hold).
    """

    def __init__(self, form="nn", act=True):
        super().__init__()
        self.a, self.b = nn.Conv2d(3, C, 1), nn.Conv2d(C, 2, 1)
        self.c = nn.Conv2d(3, C // 2, 1)
        if form == "cat":
            self.a = nn.Conv2d(3, C // 2, 1)
        self.form, self.act = form, act

    def forward(self, x):
        h = self.a(x) if self.form != "cat" else torch.cat([self.a(x), self.c(x)], 1)
        h = torch.relu(h) if self.act else h
        s = channel_shuffle(h, G) if self.form == "tv" else nn.functional.channel_shuffle(h, G)
        if self.form == "residual":
            s = s + h
        return self.b(s).mean((2, 3))


def _detect(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wsym.detect(model.eval(), x)


def _x():
    return torch.randn(2, 3, 5, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _table(spec) -> list[tuple]:
    return sorted((g.kind, g.notation, g.params) for g in spec.groups)


def _model(form="nn", act=True):
    torch.manual_seed(0)
    return Shuffled(form, act).double()


ALL = ("a.weight", "a.bias", "b.weight")


@pytest.mark.parametrize("form", ["nn", "tv"])
def test_shuffle_gets_the_whole_symmetric_group(form):
    model, x = _model(form), _x()
    spec = _detect(model, x)
    assert _table(spec) == [("permutation", "S_12", ALL), ("scaling", "(R+)^12", ALL)]
    (inner,) = spec.layout["b.weight"][1].children
    assert inner.relabel == SIGMA and spec.layout["a.weight"][0].children[0].relabel == ()
    assert independent_deviation(model, x, spec, seeds=(0, 1, 2)) < 1e-12


@pytest.mark.parametrize("form", ["nn", "tv"])
def test_linear_shuffle_gets_gl_of_all_channels(form):
    model, x = _model(form, act=False), _x()
    spec = _detect(model, x)
    assert _table(spec) == [("gl", "GL(12)", ALL)]
    assert independent_deviation(model, x, spec, seeds=(0, 1)) < 1e-12


def _permutation(spec, perm):
    i = next(i for i, g in enumerate(spec.groups) if g.kind == "permutation")
    return GroupElement(((i, torch.as_tensor(perm)),))


def test_act_is_the_conjugate_permutation_after_the_shuffle():
    """Unit u of ``a`` becomes unit perm[u]; after the shuffle, sigma^-1 perm sigma acts."""
    model, x = _model(), _x()
    spec, sd = _detect(model, x), model.state_dict()
    perm = torch.randperm(C, generator=torch.Generator().manual_seed(3))
    moved = spec.act(_permutation(spec, perm), sd)
    sigma = torch.tensor(SIGMA)
    assert torch.equal(moved["a.weight"], sd["a.weight"][perm])
    expected = sd["b.weight"][:, torch.argsort(sigma)[perm[sigma]]]
    assert torch.equal(moved["b.weight"], expected)


def test_group_laws_hold_exactly_on_the_relabeled_axis():
    model, x = _model(), _x()
    assert_group_laws(_detect(model, x), model.state_dict())


def _unlabeled(spec: SymmetrySpec, relabel=()) -> SymmetrySpec:
    """``spec`` with b.weight's input axis read through ``relabel`` instead (a wrong claim)."""
    (inner,) = spec.layout["b.weight"][1].children
    dims = list(spec.layout["b.weight"])
    dims[1] = Split("prod", (dataclasses.replace(inner, relabel=relabel),))
    layouts = tuple((p, tuple(dims) if p == "b.weight" else d) for p, d in spec.layouts)
    return dataclasses.replace(spec, layouts=layouts)


@pytest.mark.parametrize("wrong", ["identity", "inverse"])
def test_a_wrong_relabeling_is_caught(wrong):
    """Negative control: the same S_12 without the shuffle's relabeling (or with its inverse)."""
    model, x = _model(), _x()
    spec = _detect(model, x)
    relabel = () if wrong == "identity" else tuple(torch.argsort(torch.tensor(SIGMA)).tolist())
    bad = _unlabeled(spec, relabel)
    assert independent_deviation(model, x, bad, seeds=(0,)) > 1e-2
    report = bad.verify(model, x)
    assert report.failed == [0, 1]  # the permutation and the per-channel scaling


def test_relabeling_survives_json_and_bad_ones_are_refused():
    spec = _detect(_model(), _x())
    assert SymmetrySpec.from_json(spec.to_json()) == spec
    with pytest.raises(WsymInputError, match="permutation of range"):
        Leaf(0, 3, 0, 0, relabel=(0, 0, 1))


def test_where_the_merge_does_not_hold_nothing_is_claimed():
    """Shuffled channels added to the unshuffled ones: the merge would relabel a class into itself.

    Read as its (3, 4) factors, the shuffle then meets the unshuffled axis, which
    blocks the channels: no group acts on them (conservative).
    """
    model, x = _model("residual"), _x()
    spec = _detect(model, x)
    assert not any(leaf.relabel for _, d in spec.layouts for t in d for leaf in _leaves(t))
    assert not spec.groups, spec.table()
    assert "incompatible reshapes" in spec.explain("b.weight")


def test_a_shuffle_of_concatenated_classes_permutes_each():
    """``shuffle(cat(a(x), c(x)))``: S_6 x S_6, each half's units interleaved by the shuffle.

    The next conv's input axis is the concatenation of both classes, relabeled;
    ``act`` is checked entry for entry against the conjugated permutation.
    """
    model, x = _model("cat"), _x()
    spec = _detect(model, x)
    a, c = ("a.weight", "a.bias", "b.weight"), ("b.weight", "c.weight", "c.bias")
    assert _table(spec) == sorted(
        [("permutation", "S_6", a), ("scaling", "(R+)^6", a)]
        + [("permutation", "S_6", c), ("scaling", "(R+)^6", c)]
    )
    (inner,) = spec.layout["b.weight"][1].children
    assert inner.mode == "cat" and inner.relabel == SIGMA
    assert independent_deviation(model, x, spec, seeds=(0, 1, 2)) < 1e-12
    gen = torch.Generator().manual_seed(6)
    sd, sigma = model.state_dict(), torch.tensor(SIGMA)
    perm = torch.cat([torch.randperm(6, generator=gen), 6 + torch.randperm(6, generator=gen)])
    first, second = (k for k, g in enumerate(spec.groups) if g.kind == "permutation")
    assert "a.weight" in spec.groups[first].params
    moved = spec.act(GroupElement(((first, perm[:6]), (second, perm[6:] - 6))), sd)
    for name, rows in (("a", perm[:6]), ("c", perm[6:] - 6)):
        for key in (f"{name}.weight", f"{name}.bias"):
            assert torch.equal(moved[key], sd[key][rows])
    assert torch.equal(moved["b.weight"], sd["b.weight"][:, torch.argsort(sigma)[perm[sigma]]])


def _leaves(t):
    return [t] if isinstance(t, Leaf) else [leaf for c in t.children for leaf in _leaves(c)]


def test_consumers_on_a_shuffled_class():
    """Canonical forms are orbit invariants; alignment recovers the function; metanet refuses."""
    from wsym.metanet.graph import GraphSchema

    model, x = _model(), _x()
    spec, sd = _detect(model, x), model.state_dict()
    moved = spec.act(spec.sample(4, scale=(0.1, 10)), sd)
    a, b = wsym.canonicalize(sd, spec), wsym.canonicalize(moved, spec)
    assert all(torch.allclose(a[k], b[k], rtol=1e-10, atol=1e-12) for k in sd)
    aligned = wsym.align(sd, moved, spec)
    assert all(torch.allclose(aligned[k], sd[k], rtol=1e-8, atol=1e-10) for k in sd)
    with pytest.raises(WsymInputError, match="relabels a class"):
        GraphSchema(spec)


def test_quotient_sharpness_is_invariant_on_a_shuffled_class():
    """Geodesic sharpness modulo the group reads the shuffled axis through the block reader."""
    import copy

    from wsym.sharpness import sharpness

    model, x = _model(), _x()
    spec = _detect(model, x)
    target = torch.randn(2, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def value(m):
        loss = lambda out, t: ((out - t) ** 2).mean()  # noqa: E731
        return sharpness(m, [(x, target)], loss, spec=spec, measure="geodesic-inv", steps=3)

    other = copy.deepcopy(model)
    other.load_state_dict(spec.act(spec.sample(5, scale=(1e-2, 1e2)), model.state_dict()))
    before, after = value(model), value(other)
    assert before != 0 and abs(after - before) <= 1e-6 * abs(before)


def test_shufflenet_branch_units_permute_through_its_last_shuffle():
    """torchvision ShuffleNetV2: the last shuffle reads ``cat(x1, branch2(x2))``.

    Permuting the branch's 96 output units (its last conv's rows and BatchNorm) and
    conv5's odd input columns holds (checked by hand here), and detection claims it:
    S_96 and its scalings on conv5's input axis, which is the concatenation relabeled.
    """
    from torchvision.models import shufflenet_v2_x0_5

    torch.manual_seed(0)
    model = shufflenet_v2_x0_5().double().eval()
    gen = torch.Generator().manual_seed(9)
    generic = {  # BatchNorm statistics and scales off their initial values
        k: (torch.rand(v.shape, generator=gen, dtype=v.dtype) + 0.5 if v.ndim == 1 else v)
        for k, v in model.state_dict().items()
    }
    model.load_state_dict(generic)
    sd, moved = model.state_dict(), dict(model.state_dict())
    perm = torch.randperm(96, generator=torch.Generator().manual_seed(7))
    for key in sd:
        if key.startswith("stage4.3.branch2.5.") or key.startswith("stage4.3.branch2.6."):
            moved[key] = sd[key] if sd[key].ndim == 0 else sd[key][perm]
    cols = torch.arange(192)
    cols[1::2] = 2 * perm + 1  # position 2u + 1 reads branch unit u
    moved["conv5.0.weight"] = sd["conv5.0.weight"][:, cols]
    other = shufflenet_v2_x0_5().double().eval()
    other.load_state_dict(moved)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(other(x), model(x), rtol=1e-12, atol=1e-12)
        cols[1::2] = torch.arange(1, 192, 2)  # negative control: the columns left in place
        moved["conv5.0.weight"] = sd["conv5.0.weight"][:, cols]
        other.load_state_dict(moved)
        assert (other(x) - model(x)).abs().max() > 1e-3 * model(x).abs().max()
    spec = _detect(model, x)
    assert spec.kinds() == {"permutation": 21, "norm_scaling": 65, "sign": 79, "scaling": 30}
    acting = [spec.groups[i] for i in spec.groups_of("conv5.0.weight")[1]]
    assert sorted((g.kind, g.notation) for g in acting) == [
        ("norm_scaling", "(R+)^96"),
        ("permutation", "S_96"),
        ("scaling", "(R+)^96"),
        ("sign", "Z2^96"),
    ]
    (inner,) = spec.layout["conv5.0.weight"][1].children
    assert inner.mode == "cat" and inner.relabel[:4] == (0, 96, 1, 97)


def test_gather_reads_the_shuffled_axis_in_class_order():
    """GL(12)'s blocks: the next conv's columns come back unshuffled; scatter is the adjoint."""
    from wsym.group.layout import gather, scatter

    model, x = _model(act=False), _x()
    spec, sd = _detect(model, x), model.state_dict()
    parts = gather(spec, spec.groups[0], sd)
    w = sd["b.weight"].reshape(2, C)
    assert torch.equal(parts[1][-2:], w[:, torch.argsort(torch.tensor(SIGMA))])
    p = {k: torch.randn(v.shape, dtype=torch.float64) for k, v in parts.items()}
    back = scatter(spec, spec.groups[0], p, sd)
    lhs = sum((parts[k] * p[k]).sum() for k in parts)
    rhs = sum((sd[k] * back[k]).sum() for k in back)
    assert torch.allclose(lhs, rhs, rtol=1e-13)
    assert torch.equal(scatter(spec, spec.groups[0], parts, sd)["b.weight"], sd["b.weight"])


class Refed(nn.Module):
    """``h + cat(shuffle(h)[:, :6], c(x))``: the shuffle's output, sliced, added to its input."""

    def __init__(self):
        super().__init__()
        self.a, self.c, self.b = nn.Conv2d(3, C, 1), nn.Conv2d(3, C // 2, 1), nn.Conv2d(C, 2, 1)

    def forward(self, x):
        h = torch.relu(self.a(x))
        s = nn.functional.channel_shuffle(h, G)
        return self.b(h + torch.cat([s[:, : C // 2], self.c(x)], 1)).mean((2, 3))


def test_a_shuffle_sliced_into_its_own_input_claims_only_what_holds():
    torch.manual_seed(0)
    model, x = Refed().double(), _x()
    spec = _detect(model, x)
    assert independent_deviation(model, x, spec, seeds=(0, 1)) < 1e-12
