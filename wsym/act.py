"""Moved to :mod:`wsym.group.elements` (and :mod:`wsym.group.layout`); this shim re-exports."""

from wsym.group.elements import GroupElement, _check_state, act, sample, sample_group
from wsym.group.kinds.translation import translation_size
from wsym.group.layout import block_plan, map_blocks, transform
from wsym.group.memo import derived

__all__ = [
    "GroupElement",
    "_check_state",
    "act",
    "block_plan",
    "derived",
    "map_blocks",
    "sample",
    "sample_group",
    "transform",
    "translation_size",
]
