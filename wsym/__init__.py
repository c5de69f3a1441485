"""wsym: symmetry-aware weight-space toolkit for PyTorch."""

from wsym.act import GroupElement
from wsym.align import align
from wsym.canon import canonicalize
from wsym.connectivity import Curve, interpolate
from wsym.detect import detect
from wsym.merge import merge
from wsym.sharpness import sharpness
from wsym.spec import Group, SymmetrySpec
from wsym.teleport import teleport

__version__ = "0.1.0"

__all__ = [
    "Curve",
    "Group",
    "GroupElement",
    "SymmetrySpec",
    "align",
    "canonicalize",
    "detect",
    "interpolate",
    "merge",
    "sharpness",
    "teleport",
]
