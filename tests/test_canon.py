"""Canonical forms: one representative per orbit, computing the same function."""

import pytest
import torch
from cases import BY_NAME
from hypothesis import given, settings
from hypothesis import strategies as st
from test_detect import as_float64, outputs

import wsym
from wsym.models.networks import MLP

CASES = [
    "mlp-relu",
    "mlp-tanh",
    "residual-cnn",
    "tiny-transformer",
    "tiny-transformer-rotary",
    "bert",
    "mha",
    "gqa",
    "swiglu",
    "concat",
    "e3nn-gate",
    "llama",
    pytest.param("resnet18", marks=pytest.mark.slow),
]


def double(sd):
    return {k: v.double() if v.is_floating_point() else v for k, v in sd.items()}


def close(a, b, rel=1e-6):
    for k in a:
        if a[k].is_floating_point() and a[k].numel():
            scale = a[k].abs().max().clamp_min(1e-12)
            assert (a[k] - b[k]).abs().max() <= rel * scale, k


@pytest.mark.parametrize("name", CASES)
def test_canonical_form_is_constant_on_orbits(detected, name):
    model, inputs, spec = detected(name)
    sd = double(model.state_dict())
    canon = wsym.canonicalize(sd, spec)
    for seed in (0, 1):
        close(
            canon, wsym.canonicalize(spec.act(spec.sample(seed=seed, scale=(1e-2, 1e2)), sd), spec)
        )


@pytest.mark.parametrize("name", CASES)
def test_canonical_form_computes_the_same_function(detected, name):
    model, inputs, spec = detected(name)
    model64, inputs64 = as_float64(model, inputs)
    sd = model64.state_dict()
    y0, y1 = outputs(model64, sd, inputs64), outputs(model64, wsym.canonicalize(sd, spec), inputs64)
    assert (y1 - y0).abs().max() <= BY_NAME[name].tol * 10 * y0.abs().max()


def test_canonical_scales_are_balanced(detected):
    model, _, spec = detected("mlp-relu")
    canon = wsym.canonicalize(double(model.state_dict()), spec)
    w_in = torch.cat([canon["0.weight"], canon["0.bias"][:, None]], 1).norm(dim=1)
    w_out = canon["2.weight"].norm(dim=0)
    torch.testing.assert_close(w_in, w_out)


def test_canonical_gl_blocks_are_balanced(detected):
    model, _, spec = detected("tiny-transformer")
    canon = wsym.canonicalize(double(model.state_dict()), spec)
    g = torch.cat([canon["blocks.0.attn.q.weight"], canon["blocks.0.attn.q.bias"][:, None]], 1)[:4]
    h = torch.cat([canon["blocks.0.attn.k.weight"], canon["blocks.0.attn.k.bias"][:, None]], 1)[:4]
    torch.testing.assert_close(g @ g.T, h @ h.T)  # G^T G = H^T H for the first head
    assert canon["blocks.0.attn.k.bias"].abs().max() == 0  # the key bias is removed


def test_rank_deficient_gl_warns(detected):
    model, _, spec = detected("linear-linear")
    with pytest.warns(UserWarning, match="not unique"):
        wsym.canonicalize(double(model.state_dict()), spec)


@settings(max_examples=10, deadline=None)
@given(
    widths=st.lists(st.integers(2, 6), min_size=1, max_size=3),
    activation=st.sampled_from(["relu", "tanh", "leaky_relu", "gelu"]),
    seed=st.integers(0, 1000),
)
def test_canonical_forms_of_random_mlps(widths, activation, seed):
    torch.manual_seed(seed)
    mlp = MLP(3, widths, 2, activation)
    spec = wsym.detect(mlp, torch.randn(4, 3))
    sd = double(mlp.state_dict())
    close(
        wsym.canonicalize(sd, spec), wsym.canonicalize(spec.act(spec.sample(seed=seed), sd), spec)
    )
