"""What is derived from a spec, and what travels beside it, kept outside the spec.

A :class:`~wsym.group.spec.SymmetrySpec` is an immutable value: nothing is
written into it after construction. Values computed from it (block plans,
class maps, which groups commute) are memoized here, in one table per spec
object, keyed by the object's ``id`` and dropped when the spec is collected
(a weak reference's callback); the traced architecture graph that
:func:`wsym.detect` produces is kept in the same table.

Keying by identity rather than by value keeps a lookup O(1) (hashing a spec
hashes its whole layout); two equal specs simply hold equal memos.

Example:
    >>> from wsym.group.spec import SymmetrySpec
    >>> spec = SymmetrySpec(groups=(), layouts=())
    >>> derived(spec, "answer", lambda: 42), derived(spec, "answer", lambda: 0)
    (42, 42)
    >>> "_derived" in spec.__dict__
    False
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

_TABLES: dict[int, tuple[weakref.ref, dict]] = {}
_GRAPH = object()  # the table key of the traced graph (never a user key)


def table(spec) -> dict:
    """The memo table of ``spec`` (created empty on first use)."""
    key = id(spec)
    entry = _TABLES.get(key)
    if entry is not None and entry[0]() is spec:
        return entry[1]
    memo: dict = {}
    ref = weakref.ref(spec, lambda r, key=key: _drop(key, r))
    _TABLES[key] = (ref, memo)
    return memo


def _drop(key: int, ref: weakref.ref) -> None:
    entry = _TABLES.get(key)
    if entry is not None and entry[0] is ref:
        del _TABLES[key]


def derived(spec, key, compute: Callable[[], Any]):
    """``compute()``, memoized for ``spec`` under ``key`` (the spec is immutable)."""
    memo = table(spec)
    if key not in memo:
        memo[key] = compute()
    return memo[key]


def graph_of(spec):
    """The traced architecture graph kept beside ``spec`` (None if there is none)."""
    return table(spec).get(_GRAPH)


def attach_graph(spec, graph) -> None:
    """Keep ``graph`` (a ``networkx.DiGraph``) beside ``spec``; the spec is not changed."""
    table(spec)[_GRAPH] = graph
