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


def _bert_heads_64():
    """An HF BERT layer with heads of 64 (float32 GL round-off ~1e-4: above the sweep's tol)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=128, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=256, vocab_size=100)  # fmt: skip
    model = transformers.BertModel(cfg).eval()
    return model, {"input_ids": torch.randint(0, 100, (2, 7))}


@pytest.mark.parametrize("name", ["bert-heads-64", "llama", "residual-cnn"])
def test_float32_balancing_stops_at_its_round_off_floor(detected, name, monkeypatch):
    """Float32 GL blocks move by round-off forever: the sweeps stop there, not at 1000.

    The float32 form stays the float64 one to float32 accuracy and constant on orbits.
    """
    import importlib

    canon_mod = importlib.import_module("wsym.align.canonicalize")
    if name == "bert-heads-64":
        model, inputs = _bert_heads_64()
        spec = wsym.detect(model, inputs)
    else:
        model, inputs, spec = detected(name)
    sd = model.state_dict()
    steps = []
    solve = canon_mod._continuous
    monkeypatch.setattr(
        canon_mod, "_continuous", lambda *a: steps.append(1) or solve(*a), raising=True
    )
    form32 = wsym.canonicalize(sd, spec, dtype=torch.float32)
    continuous = sum(g.kind in canon_mod.CONTINUOUS for g in spec.groups)
    assert len(steps) <= 30 * max(continuous, 1)  # sweeps of every group: 1001 before
    form64 = wsym.canonicalize(double(sd), spec)
    close(form64, {k: v.double() for k, v in form32.items()}, rel=1e-3)
    moved = spec.act(spec.sample(seed=0, scale=(0.5, 2)), double(sd))
    other32 = wsym.canonicalize({k: v.float() for k, v in moved.items()}, spec, dtype=torch.float32)
    close(form64, {k: v.double() for k, v in other32.items()}, rel=1e-3)


@pytest.mark.slow
def test_a_norm_scaling_read_inversely_takes_the_balanced_minimum():
    """torchvision's EfficientNet-B1: a residual stream's scale is a norm scaling (a
    depthwise branch's BatchNorm absorbs it) that the next stage's wider 1x1 conv reads
    inversely, while that conv's rows are a BatchNorm input normalized to unit norm.
    Unit norm on both sides cannot hold at once (96 rows, 16 columns): normalizing each
    in turn grew the scales to inf. The form is finite, constant on orbits, and computes
    the same function.
    """
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.efficientnet_b1().double().eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    spec = wsym.detect(model, x)
    mixed = [
        g
        for g in spec.groups
        if g.kind == "norm_scaling" and {e > 0 for e in dict(g.exponents).values()} == {True, False}
    ]
    assert mixed  # the case this test is about
    sd = model.state_dict()
    canon = wsym.canonicalize(sd, spec)
    assert all(torch.isfinite(v).all() for v in canon.values() if v.is_floating_point())
    moved = spec.act(spec.sample(seed=0, scale=(0.1, 10)), sd)
    close(canon, wsym.canonicalize(moved, spec), rel=1e-8)
    y0 = torch.func.functional_call(model, sd, (x,))
    y1 = torch.func.functional_call(model, canon, (x,))
    assert (y1 - y0).abs().max() <= 1e-9 * y0.abs().max()
