"""Testing: public assertions (:mod:`~wsym.testing.assertions`) and float64 oracles."""

from wsym.testing.assertions import (
    assert_invariant,
    assert_sensitive,
    invariance_error,
    perturbed,
    uncoupled_permutation,
)

__all__ = [
    "assert_invariant",
    "assert_sensitive",
    "invariance_error",
    "perturbed",
    "uncoupled_permutation",
]
