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
is matched as well as the signatures allow and left to weight matching.
"""

from __future__ import annotations

import torch

from wsym.align.assignment import assignment
from wsym.align.matching import plans
from wsym.group.elements import GroupElement
from wsym.group.spec import SymmetrySpec
from wsym.group.units import _class_blocks


def signature_distances(spec: SymmetrySpec, ref: dict, other: dict, cls: int) -> torch.Tensor:
    """``(n, n)``: squared distances between the units' signatures of class ``cls``.

    Memory: one parameter block's sorted copy per checkpoint at a time.
    """
    total = None
    blocks_ref = _class_blocks(spec, ref, cls, False)
    blocks_other = _class_blocks(spec, other, cls, False)
    for (a, lv), (b, _) in zip(blocks_ref, blocks_other, strict=True):
        axis = next(i for i, leaf in enumerate(lv) if leaf.cls == cls)
        rows_a = a.movedim(axis, 0).reshape(a.shape[axis], -1).abs().sort(dim=1).values
        rows_b = b.movedim(axis, 0).reshape(b.shape[axis], -1).abs().sort(dim=1).values
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
    comps = []
    for plan in plans(spec):
        cls = spec.groups[plan.group].cls
        distances = signature_distances(spec, ref, other, cls)
        if distances is None:
            continue
        perm = assignment(-distances)
        if (perm != torch.arange(len(perm))).any():
            comps.append((plan.group, perm))
    return GroupElement(tuple(comps))
