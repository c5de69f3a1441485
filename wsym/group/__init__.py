"""The group layer: the spec, the kinds, elements, the block reader, generators.

The spec is an immutable value; one class per symmetry kind carries sampling,
action, inverse, composition and the infinitesimal action; elements act on
state dicts; the block reader gathers a group's blocks; generators and
conserved quantities serve the quotient geometry.

Reads nothing downstream (detection, alignment, geometry, meta-networks read it).
"""

from wsym.group import methods  # noqa: F401  (binds spec.sample/act/conserved/verify)
from wsym.group.elements import GroupElement, act, sample
from wsym.group.kinds import KIND_CLASSES, Kind, kind_of
from wsym.group.spec import KINDS, Group, Leaf, Split, SymmetrySpec, leaves

__all__ = [
    "KINDS",
    "KIND_CLASSES",
    "Group",
    "GroupElement",
    "Kind",
    "Leaf",
    "Split",
    "SymmetrySpec",
    "act",
    "kind_of",
    "leaves",
    "sample",
]
