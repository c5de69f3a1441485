"""Coverage of stock layers (issue #16): exact group tables, checked independently in float64."""

import copy

import pytest
import torch
from cases import independent_deviation
from torch import nn
from torch.nn.utils import parametrizations

import wsym


def detect_checked(model, x, expected):
    spec = wsym.detect(model.eval(), x)
    assert spec.kinds() == expected, spec.table()
    assert independent_deviation(model, x, spec, seeds=(0, 1)) < 1e-12
    return spec


class Recurrent(nn.Module):
    """Linear (3 -> 4), the recurrent layer, Linear on its output (or on its final states)."""

    def __init__(self, rnn, states=False):
        super().__init__()
        width = rnn.hidden_size * (2 if rnn.bidirectional or states == "lstm" else 1)
        self.a, self.rnn, self.b, self.states = nn.Linear(3, 4), rnn, nn.Linear(width, 2), states

    def forward(self, x):
        out, hn = self.rnn(self.a(x))
        if not self.states:
            return self.b(out)
        if isinstance(hn, tuple):  # LSTM: (h_n, c_n), the cell state read too
            return self.b(torch.cat([hn[0][-1], hn[1][-1]], -1))
        return self.b(hn[-1])


UNITS = {"permutation": 1, "sign": 1, "gl": 1}  # S_5 and Z2^5 on the units; GL(4) on the input
RECURRENT = [
    ("lstm", lambda: nn.LSTM(4, 5, batch_first=True), False, UNITS),
    ("lstm-cell-state", lambda: nn.LSTM(4, 5, batch_first=True), "lstm", UNITS),
    ("gru", lambda: nn.GRU(4, 5, batch_first=True), False, UNITS),
    ("rnn-tanh", lambda: nn.RNN(4, 5, batch_first=True), False, UNITS),
    ("rnn-relu", lambda: nn.RNN(4, 5, nonlinearity="relu", batch_first=True), False,
     {"permutation": 1, "scaling": 1, "gl": 1}),
    ("rnn-no-bias", lambda: nn.RNN(4, 5, bias=False, batch_first=True), False, UNITS),
    ("lstm-2-layers", lambda: nn.LSTM(4, 5, num_layers=2, batch_first=True), False,
     {"permutation": 2, "sign": 2, "gl": 1}),
    ("lstm-bidirectional-2-layers",
     lambda: nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True), False,
     {"permutation": 4, "sign": 4, "gl": 1}),
    ("gru-time-first-bidirectional", lambda: nn.GRU(4, 5, bidirectional=True), False,
     {"permutation": 2, "sign": 2, "gl": 1}),
    ("gru-2-layers-final-states", lambda: nn.GRU(4, 5, num_layers=2, batch_first=True), True,
     {"gl": 1}),  # h_n stacks both layers' units on one axis: nothing read there
]  # fmt: skip


@pytest.mark.parametrize("name, make, states, expected", RECURRENT, ids=[r[0] for r in RECURRENT])
def test_recurrent_layers(name, make, states, expected):
    torch.manual_seed(0)
    model, x = Recurrent(make(), states), torch.randn(2, 7, 3)
    spec = detect_checked(model, x, expected)
    assert {g.size for g in spec.groups if g.kind != "gl"} <= {5}


def test_lstm_signs_flip_the_cell_gate_rows_only():
    """A unit's sign flips its g-gate rows (and c, h), never the i, f, o gates."""
    torch.manual_seed(0)
    model, x = Recurrent(nn.LSTM(4, 5, batch_first=True), "lstm"), torch.randn(2, 7, 3)
    spec = wsym.detect(model.eval(), x)
    sd = model.state_dict()
    moved = spec.act(spec.sample(seed=1, kinds=("sign",)), sd)
    for key in ("rnn.weight_ih_l0", "rnn.bias_hh_l0"):
        flipped = (moved[key] != sd[key]).reshape(4, 5, -1).any(-1)
        assert flipped[2].any() and not flipped[[0, 1, 3]].any(), key
    # negative control: flipping the input gate of the same units does change the outputs
    wrong = copy.deepcopy(sd)
    wrong["rnn.weight_ih_l0"][:5] *= -1
    with torch.no_grad():
        y0 = model(x)
        model.load_state_dict(wrong)
        assert (model(x) - y0).abs().max() > 1e-3


class Act(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.a, self.b, self.fn = nn.Linear(4, 6), nn.Linear(6, 2), fn

    def forward(self, x):
        return self.b(self.fn(self.a(x)))


RELU_LIKE = {"permutation": 1, "scaling": 1}
ONLY_PERMUTATIONS = {"permutation": 1}
FORMS = [
    ("maximum-zeros", lambda h: torch.maximum(h, torch.zeros_like(h)), RELU_LIKE),
    ("minimum-zeros", lambda h: torch.minimum(h, torch.zeros_like(h)), RELU_LIKE),
    ("maximum-leaky", lambda h: torch.maximum(h, 0.1 * h), RELU_LIKE),
    ("where-relu", lambda h: torch.where(h > 0, h, 0.0), RELU_LIKE),
    ("where-leaky", lambda h: torch.where(h >= 0, h, 0.1 * h), RELU_LIKE),
    ("where-abs", lambda h: torch.where(h < 0, -h, h), RELU_LIKE),
    ("maximum-ones", lambda h: torch.maximum(h, torch.ones_like(h)), ONLY_PERMUTATIONS),
    ("maximum-0d-tensor", lambda h: torch.maximum(h, torch.tensor(0.5)), ONLY_PERMUTATIONS),
    ("where-threshold-1", lambda h: torch.where(h > 1, h, 0.0), ONLY_PERMUTATIONS),
    ("where-fill-1", lambda h: torch.where(h > 0, h, 1.0), ONLY_PERMUTATIONS),
]


@pytest.mark.parametrize("name, fn, expected", FORMS, ids=[f[0] for f in FORMS])
def test_maximum_minimum_where_forms(name, fn, expected):
    torch.manual_seed(0)
    detect_checked(Act(fn), torch.randn(3, 4), expected)


def test_the_negative_forms_really_are_not_homogeneous():
    """Control for the last rows above: a scale does change their outputs."""
    h = torch.randn(50, dtype=torch.float64) * 3
    for _, fn, expected in FORMS:
        if expected == ONLY_PERMUTATIONS:
            assert not torch.allclose(fn(2.5 * h), 2.5 * fn(h))


def tanh_net(middle):
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), middle, nn.Tanh(), nn.Linear(5, 2))


def test_weight_norm():
    """w = g v / ||v||: units permute and flip as usual; v's rows rescale and flip freely."""
    torch.manual_seed(0)
    model = tanh_net(parametrizations.weight_norm(nn.Linear(6, 5)))
    spec = detect_checked(model, torch.randn(3, 4), {"permutation": 2, "sign": 3, "scaling": 1})
    (free,) = [g for g in spec.groups if g.kind == "scaling"]
    assert free.params == ("2.parametrizations.weight.original1",) and free.size == 5


def test_spectral_norm_moves_its_power_iteration_vectors():
    torch.manual_seed(0)
    model = tanh_net(parametrizations.spectral_norm(nn.Linear(6, 5)))
    model.train()
    for _ in range(3):  # power iterations: u, v away from their initial values
        model(torch.randn(3, 4))
    spec = detect_checked(model, torch.randn(3, 4), {"permutation": 2, "sign": 2})
    by_size = {g.size: set(g.params) for g in spec.groups if g.kind == "sign"}
    assert "2.parametrizations.weight.0._v" in by_size[6]
    assert "2.parametrizations.weight.0._u" in by_size[5]


class Normed(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.a, self.norm, self.b = nn.Conv2d(3, 6, 1), norm, nn.Conv2d(6, 2, 1)

    def forward(self, x):
        return self.b(torch.relu(self.norm(self.a(x)))).mean((2, 3))


NORMS = [
    ("instance-norm", nn.InstanceNorm2d(6), {"permutation": 1}, {6}),
    ("instance-norm-affine", nn.InstanceNorm2d(6, affine=True),
     {"permutation": 1, "scaling": 1, "sign": 1}, {6}),
    ("group-norm-3", nn.GroupNorm(3, 6), {"permutation": 3}, {2}),  # one S_2 per group
    ("group-norm-2", nn.GroupNorm(2, 6), {"permutation": 2}, {3}),
    ("group-norm-1", nn.GroupNorm(1, 6), {"permutation": 1}, {6}),
    ("group-norm-6", nn.GroupNorm(6, 6), {"permutation": 1}, {6}),
    ("channel-shuffle", nn.ChannelShuffle(2), {"permutation": 1, "scaling": 1}, {6}),  # S_6
]  # fmt: skip


@pytest.mark.parametrize("name, norm, expected, sizes", NORMS, ids=[n[0] for n in NORMS])
def test_norms_and_channel_shuffle(name, norm, expected, sizes):
    torch.manual_seed(0)
    spec = detect_checked(Normed(norm), torch.randn(2, 3, 5, 5), expected)
    assert {g.size for g in spec.groups if g.kind == "permutation"} == sizes


class RelativeBias(nn.Module):
    """Attention with a learned relative-position bias per head, read by integer indexing."""

    def __init__(self, t=5, heads=2, d=4):
        super().__init__()
        self.h, self.d = heads, d
        self.qkv, self.o = nn.Linear(6, 3 * heads * d), nn.Linear(heads * d, 6)
        self.table = nn.Parameter(torch.randn(2 * t - 1, heads))
        pos = torch.arange(t)
        self.register_buffer("index", pos[:, None] - pos[None, :] + t - 1)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, self.d).permute(2, 0, 3, 1, 4)
        bias = self.table[self.index.reshape(-1)].view(t, t, self.h).permute(2, 0, 1)
        a = torch.softmax(q @ k.transpose(-1, -2) + bias, -1)
        return self.o((a @ v).transpose(1, 2).reshape(b, t, -1))


def test_relative_position_table_permutes_with_its_heads():
    torch.manual_seed(0)
    spec = detect_checked(
        RelativeBias(), torch.randn(2, 5, 6), {"gl": 2, "permutation": 1, "translation": 1}
    )
    (heads,) = [g for g in spec.groups if g.kind == "permutation"]
    assert heads.size == 2 and "table" in heads.params
