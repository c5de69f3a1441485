"""Public entry points: one WsymInputError line for bad input, nothing accepted silently,
the user's module left exactly as it was."""

import pytest
import torch

import wsym
from wsym.errors import WsymInputError


def test_the_error_and_warning_are_public():
    assert wsym.WsymInputError is WsymInputError and issubclass(WsymInputError, ValueError)
    assert issubclass(wsym.SymmetryWarning, UserWarning)


def _mlp(width=64):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 2)
    )


@pytest.fixture(scope="module")
def mlp_spec():
    mlp = _mlp()
    return mlp, wsym.detect(mlp, torch.randn(3, 64))


def _one_line(fn, match):
    with pytest.raises(WsymInputError, match=match) as err:
        fn()
    assert "\n" not in str(err.value)


class Strings(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(2, 2)

    def forward(self, x):
        return "not a tensor"


@pytest.mark.parametrize(
    "model, match",
    [
        (42, "needs a torch.nn.Module, got int"),
        (lambda x: x, "needs a torch.nn.Module, got function"),
        ({"w": torch.ones(2)}, "a state dict"),
        (torch.nn.ReLU(), "has no parameters"),
        (Strings(), "returns no floating-point tensor"),
    ],
)
def test_detect_refuses_what_it_cannot_read_in_one_line(model, match):
    _one_line(lambda: wsym.detect(model, torch.ones(3, 2)), match)


def test_canonicalize_refuses_a_wrongly_shaped_or_incomplete_state_dict(mlp_spec):
    mlp, spec = mlp_spec
    sd = mlp.state_dict()
    _one_line(lambda: wsym.canonicalize({**sd, "0.weight": torch.randn(63, 64)}, spec), "expects")
    missing = {k: v for k, v in sd.items() if k != "2.bias"}
    _one_line(lambda: wsym.canonicalize(missing, spec), "no entry '2.bias'")
    _one_line(lambda: wsym.canonicalize(mlp, spec), "needs a state dict")


def test_nan_weights_are_refused_and_said_to_be_in_the_state_dict_passed(mlp_spec):
    mlp, spec = mlp_spec
    sd = dict(mlp.state_dict())
    sd["0.bias"] = sd["0.bias"].clone()
    sd["0.bias"][0] = float("nan")
    _one_line(lambda: wsym.canonicalize(sd, spec), "0.bias .* in the state dict passed to")
    _one_line(lambda: spec.act(spec.sample(seed=0), sd), "0.bias holds NaN")


@pytest.mark.parametrize("text", ["{bad", '{"groups": 3}', "[]"])
def test_from_json_refuses_text_that_is_not_a_spec(text):
    _one_line(lambda: wsym.SymmetrySpec.from_json(text), "not a SymmetrySpec's JSON")


class Stateful(torch.nn.Module):
    """Its forward counts calls and moves an average of its hidden units."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("ema", torch.zeros(6))
        self.register_buffer("seen", torch.zeros(1), persistent=False)

    def forward(self, x):
        h = torch.relu(self.a(x))
        self.calls += 1
        self.ema.mul_(0.9).add_(0.1 * h.mean(0))
        self.seen = self.seen + 1  # a buffer replaced by a new tensor
        return self.b(h)


def test_detect_leaves_the_module_exactly_as_it_was():
    model = Stateful().train()
    model.b.eval()
    hook = model.register_forward_hook(lambda *args: None)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ema, seen = model.ema, model.seen
    spec = wsym.detect(model, torch.randn(3, 4))
    assert spec.kinds() == {"permutation": 1, "scaling": 1}
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert model.ema is ema and model.seen is seen and float(seen) == 0.0
    assert model.training and not model.b.training and model.a.training
    assert list(model._forward_hooks) == [hook.id]
