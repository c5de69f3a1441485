"""Exact nullspaces of exponent relations, against a float reference."""

import numpy as np
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

from wsym.detect.nullspace import nullspace, row_basis


def test_chain_with_relu_and_gating():
    # e_out = e_x + e_y (gating), e_y = 0 (silu), consumer -e_out
    rows = [{"out": 1, "x": -1, "y": -1}, {"y": 1}, {"down": 1, "out": 1}]
    basis = nullspace(["x", "y", "out", "down"], rows)
    assert basis == [{"x": 1, "out": 1, "down": -1}]


def test_gf2():
    rows = [{"a": 1, "b": 1, "c": 1}, {"c": 1}]
    basis = nullspace(["a", "b", "c"], rows, modulus=2)
    assert basis == [{"a": 1, "b": 1}]


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_rank_matches_scipy(nvars, nrows, seed):
    rng = np.random.default_rng(seed)
    mat = rng.integers(-2, 3, size=(nrows, nvars)) * (rng.random((nrows, nvars)) < 0.5)
    names = [f"v{i}" for i in range(nvars)]
    rows = [{names[j]: int(mat[i, j]) for j in range(nvars) if mat[i, j]} for i in range(nrows)]
    basis = nullspace(names, rows)
    ref = scipy.linalg.null_space(mat.astype(float)) if mat.any() else np.eye(nvars)
    assert len(basis) == ref.shape[1]
    for vec in basis:
        x = np.array([vec.get(n, 0) for n in names], dtype=float)
        assert np.allclose(mat @ x, 0)
    assert len(row_basis(basis)) == len(basis)
