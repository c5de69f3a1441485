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
    assert h.iterations <= 2, "the exact solve needs at most a confirming iteration"
    diff = [x - y for x, y in zip(by_cg, by_schur, strict=True)]
    assert _norm(diff) <= 1e-9 * _norm(by_cg)
    residual = [x - y for x, y in zip(h.gram(by_schur), b, strict=True)]
    assert _norm(residual) <= 1e-10 * _norm(b)


def test_an_inexact_schur_complement_is_refined_not_trusted():
    """Negative control: a perturbed factor (as round-off on near-singular blocks makes
    it) fails the probe and costs iterations, not accuracy; the exact one passes it and
    is used alone."""
    h = _horizontal("gpt2", "mixed")
    b = _rhs(h, 1)
    h.solve(b)
    assert h.trusted and h.iterations == 0
    block, factor = h._schur.groups[0]
    h._schur.groups[0] = (block, factor * 1.01)
    h.trusted = h.probe_schur()
    assert not h.trusted
    x = h.solve(b)
    assert h.iterations > 1
    residual = [u - v for u, v in zip(h.gram(x), b, strict=True)]
    assert _norm(residual) <= 1e-9 * _norm(b)


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


def test_nearly_singular_blocks_keep_the_cg_accuracy():
    """A shipped ViT fine-tune member with nearly rank-deficient query weights (smallest
    singular value ~3e-9), moved by a random element: the Schur path must agree with
    conjugate gradients (forming the complement alone lost 22% there)."""
    import warnings

    import wsym
    from wsym.sharpness import correlation, vertical
    from wsym.zoo import load

    zoo = load("data/zoos/vit-finetune")
    batches = correlation.training_subset(zoo, 64)
    model = correlation.zoo_member(zoo, 65)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = wsym.detect(model, batches[0][0][:8].double())
    moved = correlation.zoo_member(zoo, 65, correlation.scramble(spec, model.state_dict(), 65))
    values = {}
    for exact in (True, False):
        original = vertical.Horizontal.__init__

        def init(self, *args, _original=original, _exact=exact, **kw):
            _original(self, *args, **kw)
            self.exact = _exact

        vertical.Horizontal.__init__ = init
        try:
            values[exact] = wsym.sharpness(
                moved, batches, torch.nn.functional.cross_entropy, spec=spec,
                measure="geodesic-inv", rho=0.1, steps=4,
            )  # fmt: skip
        finally:
            vertical.Horizontal.__init__ = original
    assert abs(values[True] - values[False]) <= 1e-6 * abs(values[False])


@pytest.mark.parametrize("name", ["gpt2", "vit_tiny"])
def test_row_wise_units_equal_the_gather(name):
    """Units scaling whole block rows, read per row, against the gather over their entries."""
    h = _horizontal(name, "mixed")
    assert h._rowwise is not None and h._rowwise[0], "LayerNorm gains scale whole block rows"
    gen = torch.Generator().manual_seed(3)
    c = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in h._zero()]
    y = torch.randn(sum(h.sizes), generator=gen, dtype=torch.float64)
    rowwise = h.apply(c), h.adjoint(y)
    h._rowwise = None
    gathered = h.apply(c), h.adjoint(y)
    assert torch.allclose(rowwise[0], gathered[0], rtol=1e-12, atol=1e-12)
    for x, ref in zip(rowwise[1], gathered[1], strict=True):
        assert torch.allclose(x, ref, rtol=1e-12, atol=1e-12)
