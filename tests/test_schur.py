"""The exact Schur-complement solve of the coupled Gram system (float64).

Where LayerNorm gains feed attention blocks, the horizontal
projection solves its coupled Gram system through the Schur complement on the units
(``wsym.sharpness.schur``) instead of conjugate gradients; both must give the same
coefficients under both metrics, and where no closed form applies conjugate gradients
stay.
"""

import pytest
import torch
from cases import stock_case

from wsym.sharpness import schur as schur_module
from wsym.sharpness.gauge import balanced
from wsym.sharpness.perturbation import Geodesic


def _horizontal(name, metric):
    model, _, _, spec = stock_case(name)
    state = balanced(spec, model.state_dict())
    params = {n: state[n].double() for n, _ in model.named_parameters()}
    return Geodesic(params, spec, metric).horizontal


def _rhs(h, seed):
    gen = torch.Generator().manual_seed(seed)
    xi = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in h.geom.coordinates()]
    return h.adjoint(h.lower(h._flat(xi)))


def _norm(c):
    return sum(float((x * x).sum()) for x in c) ** 0.5


@pytest.mark.parametrize("name", ["gpt2", "vit_tiny"])
@pytest.mark.parametrize("metric", ["mixed", "invariant"])
def test_schur_equals_conjugate_gradients(name, metric):
    h = _horizontal(name, metric)
    if not any(h._cg[2]):
        pytest.fail(f"{name}: no coupled block, nothing to test")
    b = _rhs(h, 0)
    h.exact = False
    by_cg = h.solve(b)
    assert h.iterations > 0 and h._schur is None
    h.exact, h._reduced_layout = True, None
    by_schur = h.solve(b)
    assert h._schur is not None, "the closed form applies to LayerNorm gains feeding GL blocks"
    assert h.iterations == 0
    diff = [x - y for x, y in zip(by_cg, by_schur, strict=True)]
    assert _norm(diff) <= 1e-9 * _norm(by_cg)
    residual = [x - y for x, y in zip(h.gram(by_schur), b, strict=True)]
    assert _norm(residual) <= 1e-10 * _norm(b)


def test_a_wrong_schur_complement_is_caught():
    """Negative control: perturbing one factor breaks the solve the test above checks."""
    h = _horizontal("gpt2", "mixed")
    b = _rhs(h, 1)
    h.solve(b)
    block, factor = h._schur.groups[0]
    h._schur.groups[0] = (block, factor * 1.01)
    residual = [x - y for x, y in zip(h.gram(h.solve(b)), b, strict=True)]
    assert _norm(residual) > 1e-4 * _norm(b)


def test_orthogonal_blocks_keep_conjugate_gradients():
    """Llama's rotary (orthogonal) blocks have no closed form here."""
    h = _horizontal("llama", "mixed")
    h.solve(_rhs(h, 2))
    assert h._schur is None and h.iterations > 0


def test_large_invariant_blocks_keep_conjugate_gradients(monkeypatch):
    monkeypatch.setattr(schur_module, "MAX_ROWS", 4)
    h = _horizontal("gpt2", "invariant")
    h.solve(_rhs(h, 2))
    assert h._schur is None and h.iterations > 0
