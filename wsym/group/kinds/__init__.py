"""One small class per symmetry kind; :func:`kind_of` maps a group to its class.

================  =====================  ==========  ========  ======
kind              class                  continuous  diagonal  matrix
================  =====================  ==========  ========  ======
``permutation``   :class:`Permutation`   no          no        no
``sign``          :class:`Sign`          no          yes       no
``scaling``       :class:`Scaling`       yes         yes       no
``norm_scaling``  :class:`NormScaling`   yes         yes       no
``gl``            :class:`GL`            yes         no        yes
``orthogonal``    :class:`Orthogonal`    yes         no        yes
``translation``   :class:`Translation`   yes         no        no
================  =====================  ==========  ========  ======

(``module_permutation``: whole sibling modules exchanged, :mod:`wsym.group.kinds.modules`.)

Example:
    >>> from wsym.group.spec import Group
    >>> k = kind_of(Group("gl", 4, 2, ("w",), cls=0, index=(1,)))
    >>> type(k).__name__, k.continuous, k.matrix, k.notation(Group("gl", 4, 2, ()))
    ('GL', True, True, 'GL(4)^2')
"""

from __future__ import annotations

from wsym.group.kinds.base import Kind
from wsym.group.kinds.diagonal import NormScaling, Scaling, Sign
from wsym.group.kinds.finite import Permutation
from wsym.group.kinds.matrix import GL, Orthogonal
from wsym.group.kinds.modules import ModulePermutation
from wsym.group.kinds.translation import Translation
from wsym.group.registry import KIND_CLASSES, kind_of, kinds_where, register

for _kind in (
    Permutation(),
    Sign(),
    Scaling(),
    NormScaling(),
    GL(),
    Orthogonal(),
    Translation(),
    ModulePermutation(),
):
    register(_kind)


__all__ = [
    "GL",
    "KIND_CLASSES",
    "Kind",
    "ModulePermutation",
    "NormScaling",
    "Orthogonal",
    "Permutation",
    "Scaling",
    "Sign",
    "Translation",
    "kind_of",
    "kinds_where",
]
