"""wsym: symmetry-aware weight-space toolkit for PyTorch."""

from wsym.align.alignment import align
from wsym.align.canonicalize import canonicalize
from wsym.align.interpolate import Curve, interpolate
from wsym.align.merge import merge
from wsym.detect import detect
from wsym.errors import SymmetryWarning, WsymInputError
from wsym.group.elements import GroupElement
from wsym.group.spec import Group, SymmetrySpec
from wsym.optim.teleport import teleport
from wsym.sharpness import sharpness

__version__ = "0.1.0"

__all__ = [
    "Curve",
    "Group",
    "GroupElement",
    "SymmetrySpec",
    "SymmetryWarning",
    "WsymInputError",
    "align",
    "canonicalize",
    "detect",
    "interpolate",
    "merge",
    "sharpness",
    "teleport",
]
