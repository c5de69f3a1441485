"""``wsym.sharpness`` at a working dtype and over micro-batches: the same values."""

import pytest
import torch

import wsym
from wsym.errors import WsymInputError
from wsym.models.networks import TinyTransformer
from wsym.sharpness import measures
from wsym.sharpness.micro_batch import BatchLoss, split

WORST = ("adaptive", "geodesic-inv", "geodesic-mix")


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = TinyTransformer(depth=2).double()
    x = torch.randn(6, 10, 4, dtype=torch.float64)
    y = torch.randn(6, 10, dtype=torch.float64)
    spec = wsym.detect(model, x)
    return model, [(x, y)], spec


def _loss(out, y):
    return ((out - y) ** 2).mean()


@pytest.mark.parametrize("measure", WORST)
def test_float32_agrees_with_float64(setup, measure):
    model, batches, spec = setup
    ref = wsym.sharpness(model, batches, _loss, spec=spec, measure=measure)
    low = wsym.sharpness(model, batches, _loss, spec=spec, measure=measure, dtype=torch.float32)
    assert ref > 0
    assert abs(low - ref) <= 1e-4 * abs(ref)


def test_float32_is_the_working_precision(setup, monkeypatch):
    """The geometry is built on float32 parameters (no float64 copy of the model)."""
    model, batches, spec = setup
    seen = []
    original = measures._geometry

    def spy(spec, measure, params):
        seen.append({p.dtype for p in params.values()})
        return original(spec, measure, params)

    monkeypatch.setattr(measures, "_geometry", spy)
    wsym.sharpness(model, batches, _loss, spec=spec, measure="geodesic-inv", dtype="float32")
    assert seen == [{torch.float32}]


@pytest.mark.parametrize("measure", WORST)
def test_micro_batches_give_the_unbatched_value(setup, measure):
    model, batches, spec = setup
    whole = wsym.sharpness(model, batches, _loss, spec=spec, measure=measure, steps=4)
    parts = wsym.sharpness(
        model, batches, _loss, spec=spec, measure=measure, steps=4, micro_batch=4
    )
    assert abs(parts - whole) <= 1e-10 * abs(whole)


@pytest.mark.parametrize("measure", ["geodesic-mix", "hessian-trace"])
def test_micro_batches_average_and_curvature(setup, measure):
    model, batches, spec = setup
    kw = {"average": True} if measure.startswith("geodesic") else {"probes": 3}
    whole = wsym.sharpness(model, batches, _loss, spec=spec, measure=measure, steps=3, **kw)
    parts = wsym.sharpness(
        model, batches, _loss, spec=spec, measure=measure, steps=3, micro_batch=2, **kw
    )
    assert abs(parts - whole) <= 1e-9 * abs(whole)


def test_batch_loss_gradient_is_the_whole_batch_gradient():
    torch.manual_seed(1)
    x, y = torch.randn(7, 3, dtype=torch.float64), torch.randn(7, dtype=torch.float64)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)

    def loss_of(xb, yb):
        return lambda p: ((xb @ p["w"] - yb) ** 2).mean()

    parts = split(x, y, 3)
    f = BatchLoss([loss_of(a, b) for a, b in parts], [len(a) / 7 for a, _ in parts])
    value, (g,) = f.value_and_grad({"w": w})
    full = loss_of(x, y)({"w": w})
    (ref,) = torch.autograd.grad(full, [w])
    assert [len(a) for a, _ in parts] == [3, 3, 1]
    assert abs(value - float(full.detach())) <= 1e-14
    torch.testing.assert_close(g, ref, rtol=1e-13, atol=0)


def test_split_cuts_dict_inputs_and_keeps_other_entries():
    x = {"input_ids": torch.arange(10).reshape(5, 2), "flag": True, "mask": torch.ones(5, 2)}
    parts = split(x, torch.arange(5), 2)
    assert [p[0]["input_ids"].shape[0] for p in parts] == [2, 2, 1]
    assert all(p[0]["flag"] is True for p in parts)
    assert torch.equal(torch.cat([p[1] for p in parts]), torch.arange(5))


@pytest.mark.parametrize(
    "kw, word",
    [
        ({"micro_batch": 0}, "micro_batch"),
        ({"micro_batch": 2.5}, "micro_batch"),
        ({"dtype": torch.float16}, "float32"),
        ({"dtype": "bfloat16"}, "float32"),
    ],
)
def test_bad_dtype_or_micro_batch_is_one_line(setup, kw, word):
    model, batches, spec = setup
    with pytest.raises(WsymInputError, match=word) as err:
        wsym.sharpness(model, batches, _loss, spec=spec, measure="adaptive", **kw)
    assert "\n" not in str(err.value)
