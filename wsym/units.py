"""Moved to :mod:`wsym.group.units` (and :mod:`wsym.group.layout`); this shim re-exports."""

from wsym.group.layout import class_params
from wsym.group.units import block_classes, block_matrices, odd_rows, unit_matrix, unit_sums

__all__ = [
    "block_classes",
    "block_matrices",
    "class_params",
    "odd_rows",
    "unit_matrix",
    "unit_sums",
]
