"""Moved to :mod:`wsym.sharpness.blocks`; this shim re-exports."""

from wsym.sharpness.blocks import (
    block_groups,
    gather,
    gather_group,
    gl_groups,
    is_gl1,
    scatter,
    scatter_group,
)

__all__ = [
    "block_groups",
    "gather",
    "gather_group",
    "gl_groups",
    "is_gl1",
    "scatter",
    "scatter_group",
]
