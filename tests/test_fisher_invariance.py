"""Fisher-Riemannian sharpness at the canonical point: exactly invariant, permutations included."""

import copy
import warnings

import pytest
import torch
from cases import _stock_cnn
from torch.nn import functional as F

import wsym
from wsym.models.networks import MLP
from wsym.sharpness.curvature import fisher_riemannian_sharpness

KINDS = ["scaling", "sign", "norm_scaling", "permutation"]
TOL = 1e-6


def _cnn():
    return _stock_cnn(), (1, 6, 6), 10


CASES = {"mlp3": lambda: (MLP(6, [5, 4, 4], 3), (6,), 3), "cnn": _cnn}


def _case(name):
    torch.manual_seed(0)
    model, shape, classes = CASES[name]()
    model = model.double().eval()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, *shape, generator=gen, dtype=torch.float64)
    batches = [(x, torch.randint(0, classes, (16,), generator=gen))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = wsym.detect(model, x)
    return model, batches, spec


def _fisher(model, batches, spec):
    return fisher_riemannian_sharpness(
        model, batches, F.cross_entropy, probes=20, seed=0, relative=True, spec=spec
    )


@pytest.mark.parametrize("name", list(CASES))
def test_fisher_invariant_to_diagonal_groups_and_permutations(name):
    model, batches, spec = _case(name)
    before = _fisher(model, batches, spec)
    for seed in (1, 2):
        g = spec.sample(seed=seed, scale=(1e-2, 1e2), kinds=KINDS)
        other = copy.deepcopy(model)
        other.load_state_dict(spec.act(g, model.state_dict()))
        after = _fisher(other, batches, spec)
        assert abs(after - before) <= TOL * abs(before)  # measured: ~1e-15 relative
        if seed == 1:  # sensitivity: without the spec the probes are not transported
            plain = [_fisher(m, batches, None) for m in (model, other)]
            assert abs(plain[1] - plain[0]) > 1e-3 * abs(plain[0])


def test_fisher_with_spec_leaves_the_model_alone():
    model, batches, spec = _case("mlp3")
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    _fisher(model, batches, spec)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in sd.items())
