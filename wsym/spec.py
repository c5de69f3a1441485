"""Moved to :mod:`wsym.group.spec`; this shim re-exports."""

from wsym.group.spec import KINDS, Group, Leaf, Split, SymmetrySpec, leaves

__all__ = ["KINDS", "Group", "Leaf", "Split", "SymmetrySpec", "leaves"]
