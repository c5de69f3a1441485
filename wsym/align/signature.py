"""A start of weight matching that finds a planted permutation: sorted unit signatures.

Coordinate descent over permutation classes (:func:`wsym.align.matching.weight_matching`)
scores each class through tensors whose other axes are not matched yet; on a
network that is not a chain of layers (SqueezeNet's Fire modules, a class read by
three layers) it can stop at a wrong optimum even when ``other`` is an exact
moved copy of ``ref``. A unit's *signature* does not depend on the other
classes at all: per tensor the class touches, the unit's entries' magnitudes,
sorted. A permutation of another class reorders the entries, a sign flip
negates some, so neither changes the signature; scales do, which is why both
checkpoints are canonicalized in their continuous groups first (a canonical
form is equivariant: ``canon(P . A) = P . canon(A)``). On a moved copy the
signatures of matching units are then equal, and one linear assignment per
class on the squared distances between signatures finds the permutation,
generically exactly; weight matching continues from there. Units mixed by a
GL or orthogonal block (attention heads) have no such signature; their class
is matched as well as the signatures allow and left to weight matching. A group
with one copy per index value (one ``S_n`` per expert) is paired per copy, after
the other classes (the experts themselves, whose signatures no permutation inside
an expert changes) have been paired and applied.
"""

from __future__ import annotations

import torch

from wsym.align.matching import per_copy_assignment, plans
from wsym.group.elements import GroupElement, act
from wsym.group.spec import Group, SymmetrySpec
from wsym.group.units import _class_blocks, unit_rows


def signature_distances(spec: SymmetrySpec, ref: dict, other: dict, group: Group) -> torch.Tensor:
    """``(n, n)``: squared distances between the units' signatures of ``group``'s class.

    ``(*index, n, n)`` per copy for a group with index classes. Memory: one
    parameter block's sorted copy per checkpoint at a time.
    """
    total = None
    cls = group.cls
    blocks_ref = _class_blocks(spec, ref, cls, False)
    blocks_other = _class_blocks(spec, other, cls, False)
    for (a, lv), (b, _) in zip(blocks_ref, blocks_other, strict=True):
        axis = next(i for i, leaf in enumerate(lv) if leaf.cls == cls)
        rows_a = unit_rows(group, a, lv, axis).abs().sort(dim=-1).values
        rows_b = unit_rows(group, b, lv, axis).abs().sort(dim=-1).values
        d = torch.cdist(rows_a.double(), rows_b.double()).pow(2)
        total = d if total is None else total + d
    return total


def signature_start(spec: SymmetrySpec, ref: dict, other: dict) -> GroupElement:
    """The permutations pairing every class's units by their signatures.

    ``ref`` and ``other`` should be canonical in their continuous groups
    (:func:`wsym.align.canonicalize.canonical_element`).

    Example:
        >>> import torch, wsym
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
        >>> spec = wsym.detect(mlp, torch.randn(2, 3))
        >>> sd = {k: v.double() for k, v in mlp.state_dict().items()}
        >>> moved = spec.act(spec.sample(seed=0, kinds=["permutation"]), sd)
        >>> back = spec.act(signature_start(spec, sd, moved), moved)
        >>> all(torch.equal(back[k], sd[k]) for k in sd)
        True
    """
    comps: list = []
    todo = plans(spec)
    for per_copy in (False, True):
        if per_copy and comps:
            other = act(spec, GroupElement(tuple(comps)), other)
        for plan in todo:
            group = spec.groups[plan.group]
            if bool(group.index) != per_copy:
                continue
            distances = signature_distances(spec, ref, other, group)
            if distances is None:
                continue
            perm = per_copy_assignment(-distances)
            if (perm != torch.arange(perm.shape[-1])).any():
                comps.append((plan.group, perm))
    return GroupElement(tuple(comps))
