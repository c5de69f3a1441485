"""Numerical verification: acting with a group element must not change the outputs.

Everything runs in float64, on random inputs of the example's shape, at the
model's own parameters *and* at generic random parameters (so that a wrong group
cannot hide behind a zero-initialized branch or a near-zero layer-scale).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.func import functional_call
from torch.utils._pytree import tree_flatten

from wsym.act import act, sample
from wsym.graph.trace import eval_mode, model_inputs
from wsym.spec import SymmetrySpec

# Relative output change below which a group counts as verified. A false claim
# changes outputs by O(1e-2..1) at generic weights and random group elements;
# round-off in float64 is ~1e-14, but some models compute parts in float32
# whatever the weights' dtype (rotary tables in Hugging Face models): ~1e-7.
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3}


@dataclass(frozen=True)
class VerifyReport:
    """Largest relative output deviation per group and for all groups together."""

    deviations: tuple[float, ...]
    joint: float
    tolerance: float

    @property
    def failed(self) -> list[int]:
        """Indices of groups whose deviation exceeds the tolerance."""
        return [i for i, d in enumerate(self.deviations) if not d <= self.tolerance]

    @property
    def ok(self) -> bool:
        """Whether every group and the product verified."""
        return not self.failed and self.joint <= self.tolerance


class Probe:
    """Forward passes of one model at chosen state dicts, in float64."""

    def __init__(self, model: torch.nn.Module, example_inputs, dtype=torch.float64, seed: int = 0):
        self.model = model  # never modified: every call swaps in a state dict

        def cast(t):
            return t.detach().to(dtype) if t.is_floating_point() else t.detach()

        args, kwargs = model_inputs(model, example_inputs)
        gen = torch.Generator().manual_seed(seed)
        self.args = tuple(_randomize(a, gen, dtype) for a in args)
        self.kwargs = {k: _randomize(v, gen, dtype) for k, v in kwargs.items()}
        own = model.state_dict(keep_vars=True)
        # buffers outside the state dict (rotary frequencies, say) still need the dtype
        self.extra = {k: cast(v) for k, v in model.named_buffers() if k not in own}
        self.generic = _generic_state(own, gen, dtype)
        self._own, self._cast = own, cast
        for alias, key in tied_keys(model).items():  # tied weights stay tied
            self.generic[alias] = self.generic[key]
        self._ref: tuple = (None, None)

    @functools.cached_property
    def state(self) -> dict:
        """The model's own weights, in the probe's dtype."""
        return {k: self._cast(v) for k, v in self._own.items()}

    def reference(self, state: dict) -> torch.Tensor:
        """Outputs at ``state``, computed once per state dict object."""
        if self._ref[0] is not state:
            self._ref = (state, self(state))
        return self._ref[1]

    def __call__(self, state: dict) -> torch.Tensor:
        """Flattened float64 outputs at ``state``."""
        with torch.no_grad(), eval_mode(self.model):
            out = functional_call(
                self.model,
                {**self.extra, **state},
                self.args,
                self.kwargs,
                tie_weights=False,
                strict=False,
            )
        leaves, _ = tree_flatten(out)
        return torch.cat(
            [
                x.reshape(-1).to(torch.float64)
                for x in leaves
                if torch.is_tensor(x) and x.is_floating_point()
            ]
        )


def tied_keys(model: torch.nn.Module) -> dict[str, str]:
    """State-dict keys that share storage with an earlier key: alias -> key."""
    seen, out = {}, {}
    for k, v in model.state_dict(keep_vars=True).items():
        ident = (
            v.untyped_storage().data_ptr(),
            v.storage_offset(),
            tuple(v.shape),
            tuple(v.stride()),
        )
        if ident in seen:
            out[k] = seen[ident]
        else:
            seen[ident] = k
    return out


def _randomize(x, gen, dtype):
    """Fresh random inputs of the same shape (integer inputs are kept: token ids)."""
    if torch.is_tensor(x) and x.is_floating_point():
        return torch.randn(x.shape, generator=gen, dtype=torch.float64).to(dtype)
    return x


def _generic_state(state: dict, gen, dtype) -> dict:
    """Random weights of the same shapes and rough scale; variances stay positive.

    Uniform draws with the weights' standard deviation: as generic as Gaussian
    ones and cheaper. 1-D positive weights (norm scales, layer-scales) stay
    positive and O(1) so that no branch is switched off.
    """
    out = {}
    for k, full in state.items():
        full = full.detach()
        if not full.is_floating_point():
            out[k] = full
            continue
        sample = full.reshape(-1)[: 2**16]
        std = sample.std().item() if sample.numel() > 1 else abs(sample.sum().item())
        if std <= 1e-3:  # zero or constant init: fan-in scale for matrices, 0.5 otherwise
            std = 1.0 / max(1, full[0].numel()) ** 0.5 if full.ndim > 1 else 0.5
        a = std * 3**0.5
        r = torch.empty(full.shape, dtype=dtype).uniform_(-a, a, generator=gen)
        if k.endswith("running_var"):
            r = r.abs() + 0.5
        elif full.ndim == 1 and (full > 0).all():
            r = r.abs() + full.mean().to(dtype)
        out[k] = r
    return out


def deviation(
    probe: Probe, spec: SymmetrySpec, groups, seed: int, scale=(1e-2, 1e2), state=None, flip=False
) -> float:
    """Relative output change under one random element of ``groups`` at ``state``.

    Permutations are drawn as n-cycles and sign vectors flip at least one unit
    (``flip`` negates them), so that discrete groups are not tested at identity.
    """
    base = probe.state if state is None else state
    y0 = probe.reference(base)
    g = sample(spec, seed=seed, scale=scale, groups=groups, moving=True, flip=flip)
    y1 = probe(act(spec, g, base))
    return float((y1 - y0).abs().max() / y0.abs().max().clamp_min(1e-300))


def verify(
    spec: SymmetrySpec, model, example_inputs, seed: int = 0, trials: int = 2, scale=(1e-2, 1e2)
) -> VerifyReport:
    """Measure every group alone and all together, at actual and generic parameters.

    Trials come in pairs drawn from one seed, the second with negated sign
    vectors: between them every unit of every sign group is flipped.
    """
    probe = Probe(model, example_inputs, seed=seed)

    def worst(groups, offset):
        return max(
            deviation(probe, spec, groups, seed + offset + t // 2, scale, state, flip=t % 2 == 1)
            for t in range(trials)
            for state in (probe.state, probe.generic)
        )

    per = [worst([i], 0) for i in range(len(spec.groups))]
    everything = list(range(len(spec.groups)))
    joint = worst(everything, 100) if everything else 0.0
    return VerifyReport(tuple(per), joint, TOLERANCE[torch.float64])


def screen(
    spec: SymmetrySpec, probe: Probe, seed: int = 0, scale=(1e-2, 1e2)
) -> tuple[list[float], list[int]]:
    """Group testing: verify sets of groups jointly, bisecting only sets that fail.

    Runs at the probe's generic parameters: the detected groups are structural
    (they hold for every value of the weights), and generic values are where a
    false one shows (:func:`verify` also measures at the model's own weights).

    Returns per-group deviations (the joint deviation of the set that cleared it)
    and the indices of groups that fail on their own.
    """
    tol = TOLERANCE[torch.float64]
    devs = [float("nan")] * len(spec.groups)
    failed = []
    stack = [list(range(len(spec.groups)))] if spec.groups else []
    while stack:
        groups = stack.pop()
        d = deviation(probe, spec, groups, seed + len(groups), scale, probe.generic)
        if d <= tol:
            for i in groups:
                devs[i] = d
        elif len(groups) == 1:
            devs[groups[0]] = d
            failed.append(groups[0])
        else:
            half = len(groups) // 2
            stack.extend([groups[:half], groups[half:]])
    return devs, sorted(failed)
