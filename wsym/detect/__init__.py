"""Automatic, verified detection of parameter-space symmetries."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import warnings

import torch

from wsym.detect import expert_modules, guards
from wsym.detect.analyze import analyze, live_nodes, unknown_ops
from wsym.detect.checks import check_model, check_outputs
from wsym.detect.experts import router_weights, verified_split
from wsym.detect.restore import untouched
from wsym.detect.solve import solve
from wsym.detect.tracing.export import record_trace, trace
from wsym.detect.tracing.networkx import to_networkx
from wsym.detect.tracing.traced import Traced
from wsym.errors import SymmetryWarning, WsymInputError
from wsym.group.fits import check_spec
from wsym.group.spec import SymmetrySpec
from wsym.group.verify import float64_probe, screen, tied_keys


def spec_or_detect(spec: SymmetrySpec | None, model, example_inputs, who: str) -> SymmetrySpec:
    """``spec``, or the symmetries detected on ``example_inputs``; a clear error without both.

    Args:
        spec: the spec, if the caller has one.
        model: the module, or a zero-argument callable returning it (built only if needed).
        example_inputs: inputs to detect on.
        who: the caller's name, for the error message.
    """
    if spec is not None:
        check_spec(spec, who)
        return spec
    if example_inputs is None:
        raise WsymInputError(
            f"{who} needs the model's symmetries: pass spec=wsym.detect(model, inputs) "
            "or example_inputs=<a batch of inputs>"
        )
    module = model if isinstance(model, torch.nn.Module) else model()
    return detect(module, example_inputs)


def detect(
    model: torch.nn.Module, example_inputs, *, verify: bool = True, seed: int = 0
) -> SymmetrySpec:
    """Detect the parameter-space symmetries of ``model`` and verify each numerically.

    One forward pass in eval mode is recorded as an ATen graph
    (:func:`detection_trace`); one rule per operation
    couples tensor axes into classes and decides which groups act on each (see
    :mod:`wsym.detect.rules`). Every candidate is then checked in float64 by
    acting with random elements (group testing: sets are checked jointly and
    bisected only if they fail); a candidate that changes the outputs is dropped
    with a :class:`~wsym.errors.SymmetryWarning`.

    Args:
        model: any ``torch.nn.Module``.
        example_inputs: a Tensor, a tuple of positional inputs, or a dict of keyword inputs.
        verify: run the numerical verification (default True).
        seed: seed of the random inputs and group elements used to verify.

    Returns:
        The :class:`~wsym.group.spec.SymmetrySpec`.

    Raises:
        WsymInputError: NaN or Inf weights (naming the tensor), inputs the model
            cannot run on, or a model neither tracer can trace.

    Example:
        >>> import torch, wsym
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> spec = wsym.detect(mlp, torch.randn(3, 4))
        >>> sorted(g.kind for g in spec.groups)
        ['permutation', 'scaling']
    """
    check_model(model, example_inputs)
    with untouched(model):
        return _detect(model, example_inputs, verify, seed)


def _detect(model, example_inputs, verify: bool, seed: int) -> SymmetrySpec:
    traced = detection_trace(model, example_inputs)  # torch.export makes cyclic garbage
    check_outputs(traced)
    why = guards.unexplored(traced)
    found = None if why else guards.paths(model, example_inputs, traced.guards)
    with _collector_paused():
        spec = find_candidates(traced, model)
        spec = on_every_branch(spec, model, example_inputs, found, why)
    if verify:

        def check(s):
            s = verify_candidates(s, model, example_inputs, seed=seed)
            return verify_on_branches(s, model, example_inputs, found, seed=seed)

        spec = verified_split(spec, check, router_weights(traced))
    object.__setattr__(spec, "graph", to_networkx(traced))
    return spec


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector off while detecting (restored after).

    Solving and verifying build millions of small objects (the analysis's classes
    and rationals, the group elements), and each full collection walks every live
    object, the model's included: on a DenseNet that was a fifth of detection's
    time. What they leave in cycles is collected after.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def detection_trace(model: torch.nn.Module, example_inputs) -> Traced:
    """The recorded forward pass, or torch.export's graph where that holds an op no rule reads.

    A CPU kernel such as ``mkldnn_rnn_layer`` is one: export keeps it as ``lstm``.
    """
    traced = record_trace(model, example_inputs)
    if traced.program is None and unknown_ops(traced):
        return trace(model, example_inputs)
    return traced


def find_candidates(traced: Traced, model: torch.nn.Module) -> SymmetrySpec:
    """Candidate groups of a traced model (not yet verified); warns about blocking ops."""
    state_keys = {**traced.parameters, **traced.buffers}
    tied = tied_keys(model)
    placeholder = {key: ph for ph, key in state_keys.items()}
    ties = [
        (placeholder[a], placeholder[k])
        for a, k in tied.items()
        if a in placeholder and k in placeholder
    ]
    ctx = analyze(traced, ties)
    saved = set(model.state_dict())  # non-persistent buffers (rotary tables) are not state
    live = live_nodes(traced.graph)  # unused parameters (dead branches) carry no group
    live |= {x for pair in ties if set(pair) & live for x in pair}  # tied weights move together
    spec = solve(ctx, traced, {ph: k for ph, k in state_keys.items() if k in saved and ph in live})
    spec = expert_modules.propose(spec, traced)
    keys = set(state_keys.values())
    aliases = tuple((a, k) for a, k in tied.items() if k in keys and a not in keys)
    for message in ctx.warnings:
        warnings.warn(message, SymmetryWarning, stacklevel=3)
    return _replace(spec, spec.groups, aliases, [])


def on_every_branch(
    spec: SymmetrySpec, model, example_inputs, found, why: str | None = None
) -> SymmetrySpec:
    """The candidates every guard path proposes (:mod:`wsym.detect.guards`).

    ``found``: the paths of :func:`~wsym.detect.guards.paths` (``[]``: the trace
    has no value-dependent branch; None: they could not all be explored, and
    every group is refused as conditional, for the reason ``why`` if given).
    """
    if found == [] or not spec.groups:
        return spec
    traces = None if found is None else guards.branch_traces(model, example_inputs, found[1:])
    if traces is None:
        keep = set()
    else:
        keep = {guards.signature(spec, g) for g in spec.groups}
        for traced in traces:
            other = find_candidates(traced, model)
            keep &= {guards.signature(other, g) for g in other.groups}
    failed = [i for i, g in enumerate(spec.groups) if guards.signature(spec, g) not in keep]
    why = why or "not proposed on every branch of a value-dependent guard"
    return _drop(spec, failed, None, why)


def verify_on_branches(spec, model, example_inputs, found, seed: int = 0) -> SymmetrySpec:
    """Drop the groups that fail on a guard path, or that flip a guard's outcome."""
    if not found or not spec.groups:
        return spec
    failed = guards.failing_on_branches(spec, model, example_inputs, found, seed=seed)
    return _drop(spec, sorted(failed), None, "fails on a branch of a value-dependent guard")


def _drop(spec: SymmetrySpec, failed, devs, why: str) -> SymmetrySpec:
    """``spec`` without the groups ``failed`` (warned, noted as conditional: ``why``)."""
    if not failed:
        return spec
    groups = list(spec.groups)
    for i in failed:
        warnings.warn(
            f"refused conditional {groups[i].kind} group on {', '.join(groups[i].params[:3])}: "
            f"{why} (it holds on the traced branch only)",
            SymmetryWarning,
            stacklevel=4,
        )
    notes = tuple(
        (p, d, f"{groups[i].notation} ({groups[i].kind}) conditional: {why}")
        for i in failed
        for p, d in spec.axes_of(groups[i])
    )
    keep = [i for i in range(len(groups)) if i not in set(failed)]
    devs = [spec.deviations[i] for i in keep] if spec.deviations else []
    out = _replace(spec, [groups[i] for i in keep], spec.aliases, devs)
    return dataclasses.replace(out, notes=spec.notes + notes)


def verify_candidates(
    spec: SymmetrySpec, model: torch.nn.Module, example_inputs, seed: int = 0, stream=None
) -> SymmetrySpec:
    """Keep the groups that verify numerically (group testing); warn about the others.

    ``stream``: compute the float64 states tensor by tensor (no float64 copy of the
    model; the same outputs bit for bit); default: for models whose float64 copy
    exceeds :data:`~wsym.group.verify.STREAM_BYTES` (:func:`~wsym.group.verify.float64_probe`).
    """
    groups = list(spec.groups)
    if not groups:
        return spec
    probe = float64_probe(model, example_inputs, seed=seed, stream=stream)
    devs, failed = screen(spec, probe, seed=seed)
    for i in failed:
        g = groups[i]
        warnings.warn(
            f"dropped unverified {g.kind} group on {', '.join(g.params[:3])} "
            f"(relative output change {devs[i]:.1e})",
            SymmetryWarning,
            stacklevel=3,
        )
    keep = [i for i in range(len(groups)) if i not in failed]
    dropped = tuple(
        (
            p,
            d,
            f"{groups[i].notation} ({groups[i].kind}) dropped: outputs changed by {devs[i]:.1e}",
        )
        for i in sorted(failed)
        for p, d in spec.axes_of(groups[i])
    )
    out = _replace(spec, [groups[i] for i in keep], spec.aliases, [devs[i] for i in keep])
    return dataclasses.replace(out, notes=spec.notes + dropped)


def _replace(spec: SymmetrySpec, groups, aliases, devs) -> SymmetrySpec:
    return dataclasses.replace(
        spec, groups=tuple(groups), aliases=tuple(aliases), deviations=tuple(devs)
    )


__all__ = ["detect", "detection_trace", "find_candidates", "verify_candidates"]
