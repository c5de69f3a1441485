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

KIND_CLASSES: dict[str, Kind] = {
    k.name: k
    for k in (
        Permutation(),
        Sign(),
        Scaling(),
        NormScaling(),
        GL(),
        Orthogonal(),
        Translation(),
        ModulePermutation(),
    )
}


def kind_of(group) -> Kind:
    """The :class:`Kind` of a :class:`~wsym.group.spec.Group` (or of a kind's name)."""
    name = group if isinstance(group, str) else group.kind
    try:
        return KIND_CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown group kind {name}") from None


def kinds_where(**flags) -> tuple[str, ...]:
    """Names of the kinds whose class attributes equal ``flags``, e.g. ``continuous=True``."""
    return tuple(
        name
        for name, k in KIND_CLASSES.items()
        if all(getattr(k, f) == v for f, v in flags.items())
    )


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
