"""Numerical verification: acting with a group element must not change the outputs.

Everything runs in float64, on the real module (never on a trace), at generic
random parameters (so that a wrong group cannot hide behind a zero-initialized
branch or a near-zero layer-scale) and on inputs that exercise every
nonlinearity's range: fresh random inputs, the same scaled by 20 (pre-activations
reach saturation: ReLU6's cap, tanh's tails) and by 1/20 (the linear region,
where biases dominate). The tolerance is calibrated per model:
:data:`~wsym.group.floor.FACTOR` times the model's own numerical floor
(:mod:`wsym.group.floor`), so a group that moves outputs 1e3x above what round-off
does is rejected even if the change is tiny in absolute terms.

Detection's group testing (:func:`screen`) runs the fresh inputs in float64 and
the two regime probes in float32, against one float32 floor: what the
regimes expose (a cap or a tail reached, a bias left unscaled) moves outputs by
orders of magnitude, while the small breaks (an ``eps`` inside a normalization,
which no input scale hides) are what float64 is needed for. :func:`verify`, the
report a user asks for, runs every probe in float64.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import dataclass

import torch
from torch.func import functional_call
from torch.utils._pytree import tree_flatten

from wsym.errors import SymmetryWarning
from wsym.group.acted import ActedState
from wsym.group.adversary import adversarial_inputs, cheap
from wsym.group.depthwise import ShiftedDepthwise, has_depthwise
from wsym.group.elements import act, sample
from wsym.group.floor import FACTOR, Islands, perturbed, relative
from wsym.group.lazy import (
    CastState,
    GenericState,
    LazyState,
    OwnState,
    PerturbedState,
    call_arguments,
    scale_of,
)
from wsym.group.spec import SymmetrySpec
from wsym.models.arguments import model_failure
from wsym.models.calling import eval_mode, lacks_float64, model_inputs

# float inputs are probed at these multiples of fresh random inputs
INPUT_SCALES = (1.0, 20.0, 0.05)
# scales (and GL singular values, translation sizes) of the verifying elements: wide
# enough that a false scaling shows (relu6(10 x) != 10 relu6(x)), narrow enough that
# a true GL element's condition number (<= 100) keeps round-off near the floor
SCALE = (0.1, 10.0)
# above this many bytes of float64 weights, probes compute their states tensor by tensor
STREAM_BYTES = 2**30


@dataclass(frozen=True)
class VerifyReport:
    """Largest relative output deviation per group and for all groups together.

    ``tolerance`` is :data:`~wsym.group.floor.FACTOR` times ``floor``, the model's
    numerical floor (the largest over the probes).
    """

    deviations: tuple[float, ...]
    joint: float
    tolerance: float
    floor: float = 0.0

    @property
    def failed(self) -> list[int]:
        """Indices of groups whose deviation exceeds the tolerance."""
        return [i for i, d in enumerate(self.deviations) if not d <= self.tolerance]

    @property
    def ok(self) -> bool:
        """Whether every group and the product verified."""
        return not self.failed and self.joint <= self.tolerance


class Probe:
    """Forward passes of one model at chosen state dicts, in float64, on fixed inputs.

    Float inputs are fresh random draws of the example's shape (times
    ``input_scale``); integer inputs (token ids) are kept. :meth:`rescaled` gives
    the same probe on scaled inputs, sharing the state dicts.

    With ``stream`` the states (generic weights, their acted and cast versions, the
    floor's perturbed ones) are :class:`~wsym.group.lazy.LazyState` recipes, computed
    one tensor at a time while the forward pass reads it: no float64 copy of the
    model is held, and every output is the one the whole state dicts give, bit for
    bit (:mod:`wsym.group.lazy`). Without it, :attr:`generic` is one float64 copy
    of the weights and each acted state another.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        example_inputs,
        dtype=torch.float64,
        seed: int = 0,
        input_scale: float = 1.0,
        stream: bool = False,
    ):
        self.model = model  # never modified: every call swaps in a state dict
        self.stream = stream

        cast = _caster(dtype)
        args, kwargs = model_inputs(model, example_inputs)
        gen = torch.Generator().manual_seed(seed)
        self.args = tuple(_randomize(a, gen, dtype, input_scale) for a in args)
        self.kwargs = {k: _randomize(v, gen, dtype, input_scale) for k, v in kwargs.items()}
        self.input_scale, self.seed, self.dtype = input_scale, seed, dtype
        own = model.state_dict(keep_vars=True)
        # buffers outside the state dict (rotary frequencies, say) still need the dtype
        self.extra = {k: cast(v) for k, v in model.named_buffers() if k not in own}
        tied = tied_keys(model)
        if stream:
            self.generic = GenericState(own, gen, dtype, aliases=tied)
        else:
            self.generic = _generic_state(own, gen, dtype)
            for alias, key in tied.items():  # tied weights stay tied
                self.generic[alias] = self.generic[key]
        self._own, self._cast = own, cast
        self._ref: tuple = (None, None)
        self._floors: dict = {}
        self._shared: dict = {}  # one copy of the own weights for every rescaled probe
        self._depthwise = has_depthwise(model)  # float64 passes then use the shifted path

    @property
    def state(self) -> dict:
        """The model's own weights, in the probe's dtype (converted once, on first use)."""
        if "state" not in self._shared:
            if self.stream:
                self._shared["state"] = OwnState(self._own, self.dtype)
            else:
                self._shared["state"] = {k: self._cast(v) for k, v in self._own.items()}
        return self._shared["state"]

    def in_dtype(self, dtype) -> Probe:
        """The same probe computing in ``dtype``: its inputs cast, states cast on each call.

        It shares :attr:`generic` (the same dict, so the group elements and the
        reference cache are the same), but keeps its own floors.
        """
        other = copy.copy(self)
        other.dtype = dtype
        other._cast = cast = _caster(dtype)
        other.args = tuple(cast(a) for a in self.args)
        other.kwargs = {k: cast(v) for k, v in self.kwargs.items()}
        other.extra = {k: cast(v) for k, v in self.extra.items()}
        # the island check of the probe in the finer dtype also tells this one
        other._ref, other._floors, other._shared = (None, None), {}, {"parent": self._shared}
        return other

    def _converted(self, state: dict) -> dict:
        """``state`` in the probe's dtype.

        The last conversion is kept: one state is evaluated by several probes of a dtype.
        """
        if _in_dtype(state, self.dtype):
            return state
        last = self._shared.get("converted", (None, None))
        if last[0] is not state:
            cast = _cast_state(state, self.dtype, self._cast)
            last = (state, cast)
            self._shared["converted"] = last
        return last[1]

    def with_inputs(self, args: tuple, kwargs: dict) -> Probe:
        """The same probe on other inputs (sharing the state dicts)."""
        other = copy.copy(self)
        other.args, other.kwargs = tuple(args), dict(kwargs)
        other._ref, other._floors = (None, None), {}
        return other

    def rescaled(self, factor: float) -> Probe:
        """The same probe with its float inputs multiplied by ``factor``."""
        other = copy.copy(self)
        other.args = tuple(_scale(a, factor) for a in self.args)
        other.kwargs = {k: _scale(v, factor) for k, v in self.kwargs.items()}
        other.input_scale = self.input_scale * factor
        other._ref, other._floors = (None, None), {}
        return other

    @property
    def scalable(self) -> bool:
        """Whether the model has float inputs (that :meth:`rescaled` can scale)."""
        leaves = tree_flatten((self.args, self.kwargs))[0]
        return any(torch.is_tensor(x) and x.is_floating_point() for x in leaves)

    def reference(self, state: dict) -> torch.Tensor:
        """Outputs at ``state``, computed once per state dict object."""
        if self._ref[0] is not state:
            self._ref = (state, self(state))
        return self._ref[1]

    def floor(self, state: dict) -> float:
        """The numerical floor at ``state`` (:mod:`wsym.group.floor`), measured once per state.

        The weights are perturbed in place at the probe's own precision and restored
        exactly (:func:`~wsym.group.floor.perturbed`; the same draw for every
        rescaled probe). The lowest precision the model computes in (its islands,
        also read by the probes :meth:`in_dtype` makes) is found once: where that is
        not below the probe's dtype, the later floors run without the dispatch mode
        that perturbs them.
        """
        key = id(state)
        if key not in self._floors:
            y0 = self.reference(state)  # before the weights move
            gen = torch.Generator().manual_seed(self.seed + 7)
            eps = torch.finfo(self.dtype).eps
            seen = self._shared.get("island_eps", self._shared.get("parent", {}).get("island_eps"))
            with _perturbed(self._converted(state), gen) as moved:
                if seen is None or seen > eps:  # unknown yet, or the model has islands
                    seed = self.seed + 8
                    islands = Islands(perturb=True, gen=torch.Generator().manual_seed(seed))
                    y1 = self(moved, mode=islands)
                    # the same ops run on every input: without islands, no mode is needed again
                    self._shared["island_eps"] = islands.eps
                else:
                    y1 = self(moved)
            self._floors[key] = max(relative(y1, y0), eps)
        return self._floors[key]

    def release(self) -> None:
        """Drop the last conversion of a state to the probe's dtype (one model copy)."""
        self._shared.pop("converted", None)

    def __call__(self, state: dict, mode=None) -> torch.Tensor:
        """Flattened float64 outputs at ``state`` (under a dispatch ``mode`` if given).

        Float64 depthwise convolutions run as shifted multiply-adds
        (:mod:`wsym.group.depthwise`: the same values to round-off, several times
        faster on CPU), in every pass of the probe alike, the floor's included.
        """
        state = self._converted(state)
        if isinstance(state, LazyState):
            state = call_arguments(state)
        fast = ShiftedDepthwise() if self._depthwise and self.dtype == torch.float64 else None
        with torch.no_grad(), eval_mode(self.model):
            with mode if mode is not None else _nothing(), fast or _nothing():
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


def float64_probe(
    model: torch.nn.Module, example_inputs, seed: int = 0, stream: bool | None = None
) -> Probe:
    """A float64 :class:`Probe`, or a float32 one (with a warning) where float64 cannot run.

    Some kernels exist only for float32 and below (``torch._grouped_mm`` in Hugging
    Face's mixture-of-experts layers); such models are verified in float32, whose
    floor (and so tolerance) is about 1e9 times coarser.

    ``stream`` (default: :func:`streams`) computes the probe's states tensor by tensor
    (:class:`Probe`).
    """
    stream = streams(model) if stream is None else stream
    probe = Probe(model, example_inputs, seed=seed, stream=stream)
    try:
        probe.reference(probe.generic)
    except RuntimeError as err:
        if not lacks_float64(err):
            raise model_failure(err, "the example inputs in float64") from err
        line = str(err).strip().splitlines()[0][:160]
        warnings.warn(
            f"the model cannot run in float64 ({line}); verified in float32 instead",
            SymmetryWarning,
            stacklevel=3,
        )
        probe = Probe(model, example_inputs, dtype=torch.float32, seed=seed, stream=stream)
    return probe


def streams(model: torch.nn.Module) -> bool:
    """Whether a float64 copy of the model's float weights exceeds :data:`STREAM_BYTES`."""
    state = model.state_dict(keep_vars=True)
    return 8 * sum(v.numel() for v in state.values() if v.is_floating_point()) > STREAM_BYTES


def probes(probe: Probe, regimes=None) -> list[Probe]:
    """``probe`` and, for models with float inputs, the same on inputs scaled by 20 and 1/20.

    ``probe`` itself stands for its own scale (its reference outputs are kept).
    ``regimes``, a dtype, computes the scaled probes in it (they share one
    conversion of each state and one island check); the model's own dtype is
    used where it cannot run in ``regimes``.
    """
    if not probe.scalable:
        return [probe]

    def scaled(p: Probe) -> list[Probe]:
        return [
            probe if f == probe.input_scale else p.rescaled(f / p.input_scale) for f in INPUT_SCALES
        ]

    if regimes is None or regimes == probe.dtype:
        return scaled(probe)
    out = scaled(probe.in_dtype(regimes))
    try:
        out[1].reference(out[1].generic)  # kept: the probe needs it anyway
    except RuntimeError:
        return scaled(probe)
    return out


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


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


def _caster(dtype):
    """``cast(x)``: a float tensor detached in ``dtype``, other tensors detached, the rest as is."""

    def cast(x):
        if not torch.is_tensor(x):
            return x
        return x.detach().to(dtype) if x.is_floating_point() else x.detach()

    return cast


def _randomize(x, gen, dtype, factor: float = 1.0):
    """Fresh random inputs of the same shape (integer inputs are kept: token ids)."""
    if torch.is_tensor(x) and x.is_floating_point():
        return (factor * torch.randn(x.shape, generator=gen, dtype=torch.float64)).to(dtype)
    return x


def _scale(x, factor: float):
    return x * factor if torch.is_tensor(x) and x.is_floating_point() else x


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
        a, shift = scale_of(k, full)
        # drawn in float32 (half the cost of float64 draws), computed on in ``dtype``
        r = torch.empty(full.shape, dtype=torch.float32).uniform_(-a, a, generator=gen).to(dtype)
        out[k] = r if shift is None else r.abs_().add_(torch.tensor(shift, dtype=dtype))
    return out


def deviation(
    probe: Probe, spec: SymmetrySpec, groups, seed: int, scale=SCALE, state=None, flip=False
) -> float:
    """Relative output change under one random element of ``groups`` at ``state``.

    Permutations are drawn as n-cycles and sign vectors flip at least one unit
    (``flip`` negates them), so that discrete groups are not tested at identity.
    """
    base = probe.state if state is None else state
    y0 = probe.reference(base)
    g = sample(spec, seed=seed, scale=scale, groups=groups, moving=True, flip=flip)
    return relative(probe(acted(spec, g, base)), y0)


def verify(
    spec: SymmetrySpec, model, example_inputs, seed: int = 0, trials: int = 2, scale=SCALE
) -> VerifyReport:
    """Measure every group alone and all together, at actual and generic parameters.

    Each is measured on every probe of :func:`probes` (fresh, x20 and x1/20
    inputs). Trials come in pairs drawn from one seed, the second with negated
    sign vectors: between them every unit of every sign group is flipped.
    """
    base = float64_probe(model, example_inputs, seed=seed)
    runs = [(p, st) for p in probes(base) for st in ("s", "g")]

    def state(p, which):
        return p.state if which == "s" else p.generic

    def worst(groups, offset):
        return max(
            deviation(p, spec, groups, seed + offset + t // 2, scale, state(p, w), flip=t % 2 == 1)
            for t in range(trials)
            for p, w in runs
        )

    per = [worst([i], 0) for i in range(len(spec.groups))]
    everything = list(range(len(spec.groups)))
    joint = worst(everything, 100) if everything else 0.0
    floor = max(p.floor(state(p, w)) for p, w in runs)
    base.release()
    return VerifyReport(tuple(per), joint, FACTOR * floor, floor)


def screen(
    spec: SymmetrySpec, probe: Probe, seed: int = 0, scale=SCALE
) -> tuple[list[float], list[int]]:
    """Group testing: verify sets of groups jointly, bisecting only sets that fail.

    Runs at the probe's generic parameters: the detected groups are structural
    (they hold for every value of the weights), and generic values are where a
    false one shows (:func:`verify` also measures at the model's own weights).
    A set passes if it moves the outputs by at most the tolerance on every probe
    (fresh, x20, x1/20 inputs); the element is drawn and applied once per set,
    and the probe that failed last is tried first. A probe's tolerance is
    :data:`~wsym.group.floor.FACTOR` times the floor of the first probe that
    computes in its dtype.

    The fresh inputs run in the probe's dtype (float64); the x20 and x1/20 probes in
    float32 (module docstring), against one float32 floor, measured at x20 (on a
    model that cannot run in float64, every probe shares the fresh one's). Sharing
    it can only lower the x1/20 probe's tolerance (below ``FACTOR`` times the larger
    of the two floors, which :func:`verify` uses), so it rejects every group the two
    floors would reject, and more only where the x1/20 floor is far above the x20 one.
    The two agree within 1.4x on the architecture sweep's models (resnet18 1.4e-6 /
    1.6e-6, densenet121 2.3e-6 / 1.7e-6, efficientnet_b0 7.2e-7 / 9.8e-7, cait_xxs24
    5.2e-7 / 5.2e-7), while a true group moves float32 outputs by about the floor,
    three orders below the tolerance.

    Cost: with ``k`` false groups among ``n``, about ``3 (1 + k log2 n)`` forward
    passes (the references and the sets), one in three in float64, and a floor's pass
    per dtype only where a deviation exceeds ``FACTOR`` times its ``eps``
    (:class:`Tolerance`: false groups, float32 islands).
    For small models (:func:`~wsym.group.adversary.cheap`), the survivors are then tested
    once more in float64 on inputs pushed towards a counterexample
    (:mod:`wsym.group.adversary`; about 14 more passes).

    Returns per-group deviations (the largest deviation, on the probes in the
    finest dtype, of the set that cleared it) and the indices of groups that fail
    on their own.
    """
    all_probes = probes(probe, regimes=torch.float32)
    tols = {}
    for p in all_probes:  # one floor per dtype, on its first probe
        if p.dtype not in tols:
            tols[p.dtype] = Tolerance(p)
    for p in all_probes:
        p.reference(p.generic)  # kept per probe: then the conversion is no longer needed
    for p in all_probes:
        p.release()
    checks = [(p, tols[p.dtype]) for p in all_probes]
    devs = [0.0] * len(spec.groups)
    failed: list[int] = []
    _group_test(spec, checks, list(range(len(spec.groups))), seed, scale, devs, failed)
    alive = [i for i in range(len(spec.groups)) if i not in failed]
    if alive and probe.scalable and cheap(probe.model):  # a counterexample search on top
        saturating = probe.rescaled(INPUT_SCALES[1] / probe.input_scale)
        found = adversarial_inputs(saturating, spec, alive, seed=seed + 1, scale=scale)
        if found is not None:
            adv = probe.with_inputs(*found)
            tol = Tolerance(adv, tols[probe.dtype])
            probe.release()
            _group_test(spec, [(adv, tol)], alive, seed + 1, scale, devs, failed)
    return devs, sorted(failed)


class Tolerance:
    """:data:`~wsym.group.floor.FACTOR` times a probe's floor, measured only when needed.

    A floor is never below its dtype's ``eps`` (:meth:`Probe.floor`), so a deviation
    within ``FACTOR * eps`` is admitted whatever the floor: true groups on a model
    without float32 islands move float64 outputs by about ``eps``, and the floor's
    forward pass is then never run (detection: one float64 and one float32 pass less).
    Every decision is the one the measured floor gives. ``other``: a tolerance that
    also admits (the larger of the two).
    """

    def __init__(self, probe: Probe, other: Tolerance | None = None):
        self.probe, self.other, self.value = probe, other, None

    def admits(self, d: float) -> bool:
        """Whether deviation ``d`` is within the tolerance (measuring the floor if needed)."""
        if self.other is not None and self.other.admits(d):
            return True
        if d <= FACTOR * torch.finfo(self.probe.dtype).eps:
            return True
        if self.value is None:
            self.value = FACTOR * self.probe.floor(self.probe.generic)
        return d <= self.value


def _group_test(spec, checks, groups, seed, scale, devs, failed) -> None:
    """Bisect ``groups`` on ``checks`` (probe, tolerance); records ``devs`` and ``failed``."""
    stack = [groups] if groups else []
    while stack:
        part = stack.pop()
        d, bad, checks = _worst(spec, checks, part, seed + len(part), scale)
        if not bad:
            for i in part:
                devs[i] = max(devs[i], d)
        elif len(part) == 1:
            devs[part[0]] = d
            failed.append(part[0])
        else:
            half = len(part) // 2
            stack.extend([part[:half], part[half:]])


def _worst(spec, checks: list, part, seed: int, scale) -> tuple[float, bool, list]:
    """Largest deviation of ``part`` over the probes, and whether one exceeds its tolerance.

    The deviation is the largest on the probes in the finest dtype, or the first
    one above its tolerance (where the loop stops). Returns it with the checks
    reordered so that a failing probe comes first.
    """
    g = sample(spec, seed=seed, scale=scale, groups=part, moving=True)
    base = checks[0][0].generic
    moved = acted(spec, g, base)
    finest = min(torch.finfo(p.dtype).eps for p, _ in checks)
    worst = 0.0
    for k, (p, tol) in enumerate(checks):
        if all(q.dtype == p.dtype for q, _ in checks[k:]):  # the rest compute in one dtype
            moved = _consumed(moved, p.dtype)
        d = relative(p(moved), p.reference(base))
        if not tol.admits(d):
            return d, True, [checks[k], *checks[:k], *checks[k + 1 :]]
        if torch.finfo(p.dtype).eps == finest:
            worst = max(worst, d)
    return worst, False, checks


def _consumed(state: dict, dtype) -> dict:
    """``state``'s float tensors in ``dtype``, each dropped from ``state`` once converted.

    The float64 acted state becomes the float32 one tensor by tensor, so the two are
    never held whole at once (half a float64 model less at the peak).
    """
    if _in_dtype(state, dtype):
        return state
    if isinstance(state, LazyState):
        return CastState(state, dtype)
    cast = _caster(dtype)
    return {key: cast(state.pop(key)) for key in list(state)}


def acted(spec: SymmetrySpec, g, state):
    """``act(spec, g, state)``; an :class:`~wsym.group.acted.ActedState` for a lazy ``state``."""
    if isinstance(state, LazyState):
        return ActedState(spec, g, state)
    return act(spec, g, state)


def _cast_state(state, dtype, cast):
    if isinstance(state, LazyState):
        return CastState(state, dtype)
    return {k: cast(v) for k, v in state.items()}


@contextlib.contextmanager
def _perturbed(state, gen):
    """:func:`~wsym.group.floor.perturbed`; a :class:`~wsym.group.lazy.PerturbedState` if lazy."""
    if isinstance(state, LazyState):
        yield PerturbedState(state, gen)
    else:
        with perturbed(state, gen) as moved:
            yield moved


def _in_dtype(state: dict, dtype) -> bool:
    """Whether every float tensor of ``state`` is in ``dtype`` (nothing to convert)."""
    if isinstance(state, LazyState):
        return state.dtype == dtype
    return all(
        v.dtype == dtype for v in state.values() if torch.is_tensor(v) and v.is_floating_point()
    )
