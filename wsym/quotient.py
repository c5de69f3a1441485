"""Moved to :mod:`wsym.sharpness.quotient`; this shim re-exports."""

from wsym.sharpness.quotient import Quotient, block_groups, gather, gl_groups, scatter

__all__ = ["Quotient", "block_groups", "gather", "gl_groups", "scatter"]
