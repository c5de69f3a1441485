"""Property: for random MLP / CNN / transformer shapes, every reported group verifies."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import wsym
from wsym.models.networks import MLP, ResidualCNN, TinyTransformer

SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(model, inputs):
    torch.manual_seed(0)
    spec = wsym.detect(model, inputs)
    report = spec.verify(model, inputs, trials=1)
    assert report.ok, (spec.table(), report)
    sd = {k: v.double() for k, v in model.state_dict().items() if v.is_floating_point()}
    g = spec.sample(seed=1)
    back = spec.act(g.inverse(), spec.act(g, sd))
    for k in sd:
        torch.testing.assert_close(back[k], sd[k], rtol=1e-9, atol=1e-12)
    return spec


@SETTINGS
@given(
    widths=st.lists(st.integers(2, 6), min_size=1, max_size=3),
    activation=st.sampled_from(["relu", "tanh", "gelu", "leaky_relu", "identity", "sigmoid"]),
)
def test_mlp(widths, activation):
    spec = check(MLP(3, widths, 2, activation), torch.randn(4, 3))
    assert sum(g.kind in ("permutation", "gl") for g in spec.groups) == len(widths)


@SETTINGS
@given(channels=st.integers(2, 5), in_channels=st.integers(1, 3))
def test_cnn(channels, in_channels):
    check(ResidualCNN(in_channels, channels, 3), torch.randn(2, in_channels, 5, 5))


@SETTINGS
@given(
    heads=st.integers(1, 3),
    head_dim=st.integers(1, 4),
    depth=st.integers(1, 2),
    hidden=st.integers(2, 6),
    rotary=st.booleans(),
)
def test_transformer(heads, head_dim, depth, hidden, rotary):
    rotary = rotary and head_dim % 2 == 0
    model = TinyTransformer(
        patch=3,
        seq=4,
        dim=heads * head_dim,
        heads=heads,
        depth=depth,
        hidden=hidden,
        classes=2,
        rotary=rotary,
    )
    spec = check(model, torch.randn(2, 4, 3))
    assert any(g.kind == "orthogonal" and g.special for g in spec.groups) == rotary


@SETTINGS
@given(d=st.integers(2, 5), heads=st.sampled_from([1, 2]), ff=st.integers(2, 6))
def test_torch_encoder_layer(d, heads, ff):
    layer = nn.TransformerEncoderLayer(d * heads, heads, ff, dropout=0.0, batch_first=True)
    check(layer, torch.randn(2, 3, d * heads))
