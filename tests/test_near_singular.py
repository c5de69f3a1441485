"""Geodesic sharpness on a nearly singular attention block stays invariant (float64).

A query head whose block factor ``G = [W_q^T; b_q]`` has a smallest singular value
1e-9 times its largest (as fine-tuned ViT query weights do): under a random element of
the whole group the geodesic measures must change by less than 1e-6 relative, because
the worst case is evaluated at the GL-balanced point (``G^T G = H^T H``), where the Gram
shift ``s I`` commutes with the remaining orthogonal group (``docs/geometry.md``,
section 2.1). The negative control evaluates at the diagonal balanced point alone,
where the shift is not GL-equivariant: there the same element moves the values.
"""

import math
import warnings

import pytest
import torch

import wsym
from wsym.models.networks import TinyTransformer
from wsym.sharpness import gauge, measures

CONFIG = dict(dim=16, heads=2, depth=1, hidden=32)


def _planted(ratio: float) -> tuple[torch.nn.Module, list]:
    torch.manual_seed(0)
    model = TinyTransformer(**CONFIG).double()
    with torch.no_grad():
        q = model.blocks[0].attn.q  # head 0: rows 0..7 of the weight and of the bias
        G = torch.cat([q.weight[:8].T, q.bias[None, :8]])  # (17, 8): the block's factor
        U, S, Vh = torch.linalg.svd(G, full_matrices=False)
        S[-1] = S[0] * ratio
        G = U @ torch.diag(S) @ Vh
        q.weight[:8], q.bias[:8] = G[:16].T, G[16]
    x = torch.randn(32, 10, 4, dtype=torch.float64)
    return model, [(x, torch.randint(0, 10, (32,)))]


def _pair(model, batches, measure):
    spec = wsym.detect(model, batches[0][0])
    moved = TinyTransformer(**CONFIG).double()
    moved.load_state_dict(spec.act(spec.sample(3, scale=(1e-2, 1e2)), model.state_dict()))
    kw = dict(spec=spec, measure=measure, rho=0.1, steps=4)
    ce = torch.nn.functional.cross_entropy
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the detection's tolerance notes on the planted head
        return wsym.sharpness(model, batches, ce, **kw), wsym.sharpness(moved, batches, ce, **kw)


@pytest.mark.parametrize("measure", ["geodesic-mix", "geodesic-inv"])
def test_nearly_singular_block_is_invariant(measure):
    model, batches = _planted(1e-9)
    q = model.blocks[0].attn.q
    s = torch.linalg.svdvals(torch.cat([q.weight[:8].T, q.bias[None, :8]]).detach())
    assert float(s[-1] / s[0]) < 1e-8, "the planted block must be nearly singular"
    before, after = _pair(model, batches, measure)
    assert math.isfinite(before) and before > 0
    assert abs(after - before) <= 1e-6 * abs(before)  # measured: 1e-10 (mix), 8e-13 (inv)


def test_the_diagonal_balanced_point_alone_is_not_invariant(monkeypatch):
    """Negative control: at the diagonal balanced point the shift breaks GL-equivariance."""
    diagonal = lambda spec, state, average, dtype: gauge.balanced(spec, state)  # noqa: E731
    monkeypatch.setattr(measures, "_base_point", diagonal)
    before, after = _pair(*_planted(1e-9), "geodesic-mix")
    assert abs(after - before) > 1e-2 * abs(before)  # measured: +59%
