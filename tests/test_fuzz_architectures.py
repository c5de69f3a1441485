"""Property-based architecture fuzzer: on every drawn model (``wsym.testing.architectures``)

* every reported group holds in float64 on the example, fresh and rescaled inputs
  (x20, x1000: saturated nonlinearities), checked independently of wsym's verifier;
* ``detect`` leaves the module unchanged (state dict bit for bit, training flags);
* every public entry point either succeeds or raises one ``WsymInputError`` line,
  and what canonicalize and align return computes the same function.

``WSYM_FUZZ_EXAMPLES`` sets the number of drawn models (default 25, about a minute on
one core); ``benchmarks/fuzz_architectures.py`` runs longer and prints the counts.
"""

import copy
import os
import warnings

import torch
from hypothesis import HealthCheck, given, settings

import wsym
from wsym.errors import WsymInputError
from wsym.testing.architectures import architectures
from wsym.testing.claims import group_deviations

TOL = 1e-9  # relative output change of a true group in float64 (floor ~1e-14)
EXAMPLES = int(os.environ.get("WSYM_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the default run is the same every time; the benchmark draws fresh
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _mse(out, y):
    return ((out - y) ** 2).mean()


def _same_function(model, x, sd_a, sd_b) -> float:
    m64 = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        ya = torch.func.functional_call(m64, {k: v.double() for k, v in sd_a.items()}, (x,))
        yb = torch.func.functional_call(m64, {k: v.double() for k, v in sd_b.items()}, (x,))
    return float((ya - yb).abs().max() / ya.abs().max().clamp_min(1e-300))


def entry_points(model, x, spec) -> dict:
    """Every public entry point on the drawn model; each returns a deviation or None."""
    sd = {k: v.double() for k, v in model.state_dict().items()}
    moved = spec.act(spec.sample(seed=3, scale=(0.5, 2)), sd)
    batches, x64 = [(x, torch.zeros(x.shape[0], 2))], x.double()
    return {
        "canonicalize": lambda: _same_function(model, x64, sd, wsym.canonicalize(sd, spec)),
        "align": lambda: _same_function(model, x64, moved, wsym.align(sd, moved, spec)),
        "merge": lambda: wsym.merge([sd, moved], spec) and None,
        "interpolate": lambda: wsym.interpolate(model, sd, moved, batches, _mse, steps=2) and None,
        "sharpness": lambda: (
            wsym.sharpness(model, batches, _mse, spec=spec, measure="euclidean", steps=1) and None
        ),
        "teleport": lambda: (
            wsym.teleport(copy.deepcopy(model), spec, batches, _mse, steps=1) and None
        ),
        "json": lambda: (
            wsym.SymmetrySpec.from_json(spec.to_json()).to_json() == spec.to_json() or 1.0
        ),
    }


def check_model(model, x, *, entries: bool = True) -> dict:
    """Run the properties on one drawn model; return counts (raises on a failure)."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [m.training for m in model.modules()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            spec = wsym.detect(model, x)
        except WsymInputError as err:
            assert "\n" not in str(err)
            return {"groups": 0, "refused": 1}
    after = model.state_dict()
    assert list(after) == list(before)
    for k, v in before.items():
        assert torch.equal(after[k], v), f"detect changed {k}"
    assert [m.training for m in model.modules()] == flags, "detect changed a training flag"
    devs = group_deviations(model, x, spec)
    false = [(g.kind, g.notation, d) for g, d in zip(spec.groups, devs, strict=True) if d > TOL]
    assert not false, (false, spec.table())
    counts = {"groups": len(spec.groups), "refused": 0, "entries": 0, "entry_errors": 0}
    if not entries:
        return counts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, call in entry_points(model, x, spec).items():
            try:
                dev = call()
            except WsymInputError as err:
                assert "\n" not in str(err), name
                counts["entry_errors"] += 1
                continue
            assert dev is None or dev is True or dev < 1e-8, (name, dev)
            counts["entries"] += 1
    return counts


@FUZZ
@given(drawn=architectures())
def test_every_drawn_architecture_keeps_its_claims_and_its_state(drawn):
    model, x, recipe = drawn
    check_model(model, x, entries=False)


@settings(FUZZ, max_examples=max(1, EXAMPLES // 3))
@given(drawn=architectures(depth=0))
def test_every_entry_point_succeeds_or_refuses_in_one_line(drawn):
    model, x, recipe = drawn
    check_model(model, x)
