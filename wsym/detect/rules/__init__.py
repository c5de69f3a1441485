"""Detection rules: one small function per family of operations.

A rule reads the layouts of its inputs from the :class:`~wsym.detect.context.Context`,
couples atoms and records exponent relations, and stores the layout of its
output. :data:`RULES` maps an ATen schema name (``"aten::linear"``) to its rule;
an operation without a rule blocks every axis it touches.
"""

from wsym.detect.rules import (
    activation,
    elementwise,
    linear,
    norm,
    recurrent,
    reduce,
    shape,
    shuffle,
)

MASKS = activation.MASKS  # comparisons: boolean outputs the rules read (``where``'s mask)
RULES: dict = {}
for _module in (shape, shuffle, activation, elementwise, linear, norm, recurrent, reduce):
    RULES.update(_module.RULES)

__all__ = ["MASKS", "RULES"]
