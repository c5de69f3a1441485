"""The exact shortcut of the linear assignment against scipy and brute force."""

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment

from wsym.align.assignment import assignment, dominant_assignment


def brute_force(score: torch.Tensor) -> float:
    n = len(score)
    return max(float(score[range(n), list(p)].sum()) for p in itertools.permutations(range(n)))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 5), seed=st.integers(0, 2**31 - 1), diag=st.floats(0.0, 5.0))
def test_assignment_is_optimal_and_the_shortcut_is_scipys_answer(n, seed, diag):
    gen = torch.Generator().manual_seed(seed)
    score = torch.randn(n, n, generator=gen, dtype=torch.float64)
    score = score + diag * torch.eye(n, dtype=torch.float64)[torch.randperm(n, generator=gen)]
    perm = assignment(score)
    assert sorted(perm.tolist()) == list(range(n))
    assert float(score[torch.arange(n), perm].sum()) >= brute_force(score) - 1e-12
    fast = dominant_assignment(score)
    if fast is not None:
        _, col = linear_sum_assignment(score.numpy(), maximize=True)
        assert fast.tolist() == col.tolist()


def test_ties_and_shared_argmaxes_go_to_scipy():
    assert dominant_assignment(torch.ones(3, 3, dtype=torch.float64)) is None
    assert dominant_assignment(torch.tensor([[2.0, 1.0], [2.0, 0.0]])) is None
    big = torch.eye(300, dtype=torch.float64)[torch.randperm(300)] + 1e-3 * torch.rand(300, 300)
    assert torch.equal(
        dominant_assignment(big), torch.as_tensor(linear_sum_assignment(big, maximize=True)[1])
    )
