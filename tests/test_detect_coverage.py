"""Coverage items of issue #16, each with its exact group table and an independent check."""

import copy

import pytest
import torch
from cases import independent_deviation
from torch import nn
from torch.func import functional_call

import wsym


class ConvNet(nn.Module):
    """1x1 conv (3 -> 8), ReLU, the convolution under test (8 -> cout), ReLU, mean, linear."""

    def __init__(self, conv, cout):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(3, 8, 1), conv, nn.Linear(cout, 2)

    def forward(self, x):
        h = torch.relu(self.b(torch.relu(self.a(x))))
        return self.c(h.mean((2, 3)))


GROUPED = {"permutation": 3, "scaling": 4}  # S_G, S_a, S_b; (R+)^G twice, (R+)^a, (R+)^b
CONVS = [
    ("grouped-2", nn.Conv2d(8, 6, 3, groups=2), 6, GROUPED, {2, 3, 4}),
    ("grouped-4", nn.Conv2d(8, 8, 3, groups=4), 8, GROUPED, {2, 4}),
    ("transposed", nn.ConvTranspose2d(8, 6, 3), 6, {"permutation": 2, "scaling": 2}, {6, 8}),
    ("transposed-grouped", nn.ConvTranspose2d(8, 6, 3, groups=2), 6, GROUPED, {2, 3, 4}),
]


@pytest.mark.parametrize("name, conv, cout, expected, sizes", CONVS, ids=[c[0] for c in CONVS])
def test_grouped_and_transposed_convolutions(name, conv, cout, expected, sizes):
    torch.manual_seed(0)
    model, x = ConvNet(conv, cout), torch.randn(2, 3, 8, 8)
    spec = wsym.detect(model, x)
    assert spec.kinds() == expected, spec.table()
    assert {g.size for g in spec.groups if g.kind == "permutation"} == sizes
    assert independent_deviation(model, x, spec, seeds=(0, 1), fresh_seed=3) < 1e-12


@pytest.mark.parametrize(
    "make, x",
    [
        (lambda: nn.Sequential(nn.Linear(4, 6), nn.PReLU(6), nn.Linear(6, 2)), (3, 4)),
        (lambda: nn.Sequential(nn.Linear(4, 6), nn.PReLU(), nn.Linear(6, 2)), (3, 4)),
        (lambda: nn.Sequential(nn.Conv2d(3, 5, 1), nn.PReLU(5), nn.Conv2d(5, 2, 1)), (2, 3, 4, 4)),
    ],
    ids=["per-channel", "shared", "conv"],
)
def test_prelu_rescales_its_channels(make, x):
    torch.manual_seed(0)
    model = make()
    with torch.no_grad():
        model[1].weight.uniform_(-0.5, 0.9)  # slopes far from 0.25 and of both signs
    x = torch.randn(*x)
    spec = wsym.detect(model, x)
    assert spec.kinds() == {"permutation": 1, "scaling": 1}, spec.table()
    assert independent_deviation(model, x, spec, seeds=(0, 1), fresh_seed=3) < 1e-12
    touched = {p for g in spec.groups if g.kind == "scaling" for p in g.params}
    assert "1.weight" not in touched  # the slopes permute, never rescale


class MultiQuery(nn.Module):
    """One key/value head broadcast over four query heads (Falcon's multi-query attention)."""

    def __init__(self):
        super().__init__()
        self.q, self.kv, self.o = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 8)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, 2).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 1, 4).transpose(1, 2).split(2, dim=-1)
        h = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.o(h.transpose(1, 2).reshape(b, t, 8))


def test_broadcast_key_value_heads_pin_the_output_heads():
    """No per-head scale of the attention output: the one value head is shared."""
    torch.manual_seed(0)
    model, x = MultiQuery(), torch.randn(2, 5, 8)
    spec = wsym.detect(model, x)
    assert not any(g.kind in ("scaling", "sign") for g in spec.groups), spec.table()
    assert spec.kinds() == {"gl": 2, "permutation": 1, "translation": 1}, spec.table()
    assert independent_deviation(model, x, spec, seeds=(0, 1), fresh_seed=3) < 1e-12


def test_numpy_transpose_is_understood():
    class T(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 2)

        def forward(self, x):
            return self.b(torch.relu(self.a(x).T.T))

    spec = wsym.detect(T(), torch.randn(3, 4))
    assert spec.kinds() == {"permutation": 1, "scaling": 1}


class Padded(nn.Module):
    def __init__(self, pad):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(3, 6, 1), nn.Conv2d(6, 4, 3), nn.Linear(4, 2)
        self.pad = pad

    def forward(self, x):
        h = self.pad(torch.relu(self.a(x)))
        return self.c(torch.relu(self.b(h)).reshape_as(self.b(h)).mean((2, 3)))


@pytest.mark.parametrize(
    "pad, expected",
    [
        (nn.ZeroPad2d(1), {"permutation": 2, "scaling": 2}),
        (nn.ReflectionPad2d(1), {"permutation": 2, "scaling": 2}),
        (nn.ReplicationPad2d(1), {"permutation": 2, "scaling": 2}),
        (nn.ConstantPad2d(1, 1.0), {"permutation": 2, "scaling": 1}),  # a constant 1: affine
        (lambda h: nn.functional.pad(h, (1, 1, 1, 1), value=0.5), {"permutation": 2, "scaling": 1}),
    ],
    ids=["zero", "reflect", "replicate", "constant-1", "functional-0.5"],
)
def test_padding_keeps_channel_groups(pad, expected):
    torch.manual_seed(0)
    model, x = Padded(pad), torch.randn(2, 3, 6, 6)
    spec = wsym.detect(model, x)
    assert spec.kinds() == expected, spec.table()
    assert independent_deviation(model, x, spec, seeds=(0, 1), fresh_seed=3) < 1e-12


def test_gpt2_key_bias_translation_through_conv1d():
    """GPT-2's fused c_attn is an addmm (Conv1D): its key bias is arbitrary per head."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32, n_positions=16)
    torch.manual_seed(0)
    model = transformers.GPT2Model(cfg).eval()
    ids = {"input_ids": torch.randint(0, 32, (2, 6))}
    spec = wsym.detect(model, ids)
    expected = {"gl": 2, "permutation": 2, "scaling": 2, "sign": 2, "translation": 1}
    assert spec.kinds() == expected, spec.table()
    (t,) = [g for g in spec.groups if g.kind == "translation"]
    assert t.params == ("h.0.attn.c_attn.bias",) and t.size == 16  # the key third of it
    sd = {k: v.double() for k, v in model.state_dict().items()}
    m64 = copy.deepcopy(model).double()
    moved = spec.act(spec.sample(seed=0, scale=(0.1, 10)), sd)
    with torch.no_grad():
        y0 = functional_call(m64, sd, (), ids).last_hidden_state
        y1 = functional_call(m64, moved, (), ids).last_hidden_state
    assert (y1 - y0).abs().max() < 1e-12 * y0.abs().max()


class Repeated(nn.Module):
    """``repeat`` as XCiT's positional encoding uses it: copies along a new leading axis."""

    def __init__(self, tile: bool):
        super().__init__()
        self.tile = tile
        self.a, self.b = nn.Linear(4, 6), nn.Linear(12 if tile else 6, 2)

    def forward(self, x):
        h = torch.relu(self.a(x)).unsqueeze(0)
        return self.b(h.repeat(3, 1, 2 if self.tile else 1)).sum(0)


@pytest.mark.parametrize("tile, expected", [(False, {"permutation": 1, "scaling": 1}), (True, {})])
def test_repeat_copies_keep_the_units_and_tiles_block_them(tile, expected):
    """Copies along a size-1 axis keep the units' groups; tiling an axis of units blocks it."""
    from wsym.detect import detection_trace

    torch.manual_seed(0)
    model, x = Repeated(tile), torch.randn(5, 4)
    # copies are recorded; tiles are exported (InstanceNorm's decomposition tiles its
    # weights, and the export keeps instance_norm, which a rule reads)
    assert (detection_trace(model, x).program is None) == (not tile)
    spec = wsym.detect(model, x)
    assert spec.kinds() == expected, spec.table()
    if expected:
        assert independent_deviation(model, x, spec, seeds=(0, 1)) < 1e-12
