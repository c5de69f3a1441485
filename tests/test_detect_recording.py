"""Detection's tracer: one recorded forward pass, read like a torch.export graph."""

import warnings

import pytest
import torch
from cases import CASES
from torch import nn

from wsym.detect import find_candidates
from wsym.detect.tracing.export import record_trace, trace
from wsym.detect.tracing.record import record
from wsym.models.calling import model_inputs

FAST = [c for c in CASES if not c.slow]


@pytest.mark.parametrize("case", FAST, ids=[c.name for c in FAST])
def test_recorded_graph_gives_the_candidates_of_the_exported_one(case):
    """Same candidate groups (kinds, sizes, parameters) from either tracer."""
    torch.manual_seed(0)
    model, inputs = case.build().eval(), case.inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the same notes from both
        a = find_candidates(trace(model, inputs), model)
        b = find_candidates(record_trace(model, inputs), model)

    def table(spec):
        return sorted((g.kind, g.size, tuple(sorted(g.params))) for g in spec.groups)

    assert table(b) == table(a)


class WriteIntoView(nn.Module):
    def forward(self, x):
        y = x * 2
        y.view(-1)[:2].add_(x[0, :2])  # the base is read after a write into a view of a view
        return y.sum(0)


class WriteIntoSlice(nn.Module):
    """Swin V2's query-key-value bias: a clone with its middle third zeroed in place."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 6)
        self.out = nn.Linear(6, 2)

    def forward(self, x):
        bias = self.qkv.bias.clone()
        bias[2:4].zero_()
        return self.out(torch.relu(nn.functional.linear(x, self.qkv.weight, bias)))


class WriteIntoBase(nn.Module):
    def forward(self, x):
        y = x * 2
        v = y[:, :2]
        y.mul_(x)  # the view is read after a write into its base
        return v.sum(0)


class MaskBuiltInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        mask = torch.zeros(4)
        mask[:2] = 1.0  # a constant written through a view: fine
        return self.lin(x) * mask


@pytest.mark.parametrize("model", [WriteIntoView(), WriteIntoBase()], ids=["view", "base"])
def test_reading_a_stale_alias_is_refused_and_detection_exports(model):
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="in-place write into a view"):
        record(model, (x,), {})
    assert record_trace(model, x).program is not None  # torch.export's functional graph


def test_write_into_a_slice_is_recorded_as_a_slice_scatter():
    """The tensor's readers see the written slice put back; the groups are the export's."""
    torch.manual_seed(0)
    model, x = WriteIntoSlice(), torch.randn(3, 4)
    traced = record_trace(model, x)
    assert traced.program is None
    scatter = [n for n in traced.graph.nodes if n.target is torch.ops.aten.slice_scatter.default]
    assert len(scatter) == 1 and scatter[0].args[2:] == (0, 2, 4, 1)

    def table(spec):
        return sorted((g.kind, g.size, tuple(sorted(g.params))) for g in spec.groups)

    recorded = find_candidates(traced, model)
    assert table(recorded) == table(find_candidates(trace(model, x), model))
    # units 2:4 (bias overwritten) are a class of their own; their dead bias entries
    # are free (a GL(2) on them alone)
    assert recorded.kinds() == {"permutation": 3, "scaling": 3, "gl": 1}
    assert [g.params for g in recorded.groups if g.kind == "gl"] == [("qkv.bias",)]


def test_constant_written_in_place_is_recorded():
    traced = record_trace(MaskBuiltInPlace(), torch.randn(3, 4))
    assert traced.program is None
    mul = next(n for n in traced.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    assert mul.args[1].op == "placeholder"  # the finished mask is a constant input


def test_recorded_values_hold_no_activations():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    traced = record(model, *model_inputs(model, torch.randn(3, 4)))
    vals = [n.meta["val"] for n in traced.graph.nodes if torch.is_tensor(n.meta.get("val"))]
    assert vals and all(v.device.type == "meta" for v in vals)


def test_fused_attention_kernel_is_not_taken_while_recording():
    """The recorder's function mode sends nn.TransformerEncoderLayer down its composite path.

    The fused inference kernel (one opaque op) is skipped while a torch-function mode
    is active, so the layer is recorded, not exported, and finds what export finds.
    """
    mha = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0).eval()
    x = torch.randn(2, 3, 8)
    traced = record_trace(mha, x)
    assert traced.program is None  # recorded
    names = {n.target._schema.name for n in traced.graph.nodes if hasattr(n.target, "_schema")}
    assert "aten::_transformer_encoder_layer_fwd" not in names and "aten::addmm" in names
    assert set(traced.parameters.values()) == {name for name, _ in mha.named_parameters()}
    exported = trace(mha, x)
    kinds = [sorted(g.kind for g in find_candidates(t, mha).groups) for t in (traced, exported)]
    assert kinds[0] == kinds[1] and "gl" in kinds[0]


class SplitAfterInPlace(nn.Module):
    """timm's MixedConv2d: channels split after an in-place activation, one conv per part."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 1)
        self.parts = nn.ModuleList([nn.Conv2d(4, 6, 1), nn.Conv2d(4, 6, 3, padding=1)])
        self.head = nn.Linear(12, 2)

    def forward(self, x):
        h = torch.relu_(self.stem(x))  # the split's views share the written counter
        h = torch.cat([c(p) for c, p in zip(self.parts, torch.split(h, 4, 1), strict=True)], 1)
        return self.head(h.relu().mean((2, 3)))


def test_views_split_after_an_in_place_write_are_recorded():
    """The views a split returns carry their base's version: no fallback to torch.export."""
    model, x = SplitAfterInPlace().eval(), torch.randn(2, 3, 5, 5)
    traced = record_trace(model, x)
    assert traced.program is None  # recorded, not exported
    table = lambda t: sorted(  # noqa: E731
        (g.kind, g.size, tuple(sorted(g.params))) for g in find_candidates(t, model).groups
    )
    assert table(traced) == table(trace(model, x))
