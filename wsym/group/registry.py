"""The symmetry kinds by name: filled by :mod:`wsym.group.kinds`, read by every group.

A :class:`~wsym.group.spec.Group` names its kind (``"permutation"``, ``"gl"``, ...);
the kind's class holds what the name means (sampling, action, notation, dimension).
Specs and block layouts sit below the kinds, which read them, so they find a kind
here, by name, instead of importing the kinds: :mod:`wsym.group.kinds` registers one
instance of each class when :mod:`wsym.group` is imported.

Example:
    >>> from wsym.group.spec import Group
    >>> kind_of(Group("sign", 3, 1, ("w",))).continuous
    False
"""

from __future__ import annotations

from typing import Any

Kind = Any  # a wsym.group.kinds.base.Kind (not imported: the kinds sit above this module)

#: ``{name: kind}`` of every registered kind, in registration order.
KIND_CLASSES: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    """Register ``kind`` under its :attr:`~wsym.group.kinds.base.Kind.name`."""
    KIND_CLASSES[kind.name] = kind
    return kind


def kind_of(group) -> Kind:
    """The :class:`~wsym.group.kinds.base.Kind` of a group (or of a kind's name)."""
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
