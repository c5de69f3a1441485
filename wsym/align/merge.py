"""Merging aligned checkpoints (MergeMany for more than two)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from wsym.align.alignment import align, check_same_architecture
from wsym.align.batchnorm import reset_batchnorm_stats
from wsym.align.continuous import mismatch
from wsym.align.interpolate import interpolate
from wsym.align.repair import repair as repair_fn
from wsym.errors import WsymInputError
from wsym.group.spec import SymmetrySpec


@dataclass(frozen=True)
class MergeReport:
    """What :func:`merge` did, with ``with_report=True``.

    Attributes:
        aligned: each member moved onto the common basis (same function as the member).
        rounds: MergeMany rounds run (0: aligned to the reference once).
        mismatch: weight-matching objective ``sum_i ||aligned_i - merge||^2`` per round.
        barriers: each member's loss barrier to the merge (needs ``model``,
            ``batches`` and ``loss_fn``), else empty.
    """

    aligned: tuple[dict, ...]
    rounds: int
    mismatch: tuple[float, ...]
    barriers: tuple[float, ...] = ()


def merge(
    state_dicts: list[dict],
    spec: SymmetrySpec,
    *,
    method: str = "weights",
    continuous: str = "auto",
    residual: str = "permutation",
    refine: str = "auto",
    model: torch.nn.Module | None = None,
    batches=None,
    reset_batchnorm: bool = False,
    repair: bool = False,
    reference: int = 0,
    rounds: int = 5,
    seed: int = 0,
    loss_fn=None,
    with_report: bool = False,
    dtype: torch.dtype | None = None,
):
    """Average of ``state_dicts`` after aligning them all to a common basis.

    Two checkpoints: the second is aligned to ``state_dicts[reference]``. More
    (Git Re-Basin's MergeMany): all are first aligned to the reference, then,
    for up to ``rounds`` rounds, each member in turn (seeded order) is aligned
    anew to the mean of the *others*, until the summed distance to the merge
    stops dropping; the common basis is thus the merge's, not the first
    member's.

    Args:
        state_dicts: two or more state dicts of the architecture ``spec`` describes.
        spec: the :class:`~wsym.group.spec.SymmetrySpec`.
        method: alignment method, ``"weights"``, ``"activations"`` or ``"activations+weights"``.
        continuous: ``"auto"`` (default), ``"reference"``, ``"canonical"`` or
            ``"canonical+reference"`` (see :func:`wsym.align`).
        residual: ``"permutation"`` or ``"rotation"`` (pre-LN streams, see :func:`wsym.align`).
        refine: ``"auto"`` (default), ``"none"`` or ``"path"``: each alignment's
            continuous groups then fitted to the loss along the path (needs ``model``
            and ``batches`` with targets; ``loss_fn``, default cross-entropy; see
            :func:`wsym.align`). ``"auto"`` fits the path of two members given data
            and nothing for more: MergeMany aligns each member to the mean of the
            others, whose weight spread its rounds minimize.
        model: the module (activation matching, BatchNorm reset, REPAIR, barriers).
        batches: iterable of ``(inputs, targets)`` (activation matching, statistics).
        reset_batchnorm: recompute BatchNorm running statistics of the merge on ``batches``.
        repair: REPAIR the merge (:mod:`wsym.align.repair`; BatchNorm statistics
            recomputed, other units' statistics set to the members' mean).
        reference: index of the first reference.
        rounds: MergeMany rounds at most (more than two checkpoints).
        seed: order of the members in each round.
        loss_fn: the loss of ``refine="path"`` and, with ``with_report``, of each
            member's barrier to the merge.
        with_report: return ``(merged, MergeReport)``.
        dtype: working precision of the alignments (see :func:`wsym.align`).
            Memory: the members, their aligned copies and the merge; the mean is
            taken one tensor at a time.

    Example:
        >>> import torch, wsym
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
        >>> spec = wsym.detect(net, torch.randn(2, 3))
        >>> sd = {k: v.double() for k, v in net.state_dict().items()}
        >>> merged = wsym.merge([sd, spec.act(spec.sample(seed=2), sd)], spec)
        >>> max(float((merged[k] - sd[k]).abs().max()) for k in sd) < 1e-9
        True
    """
    if isinstance(state_dicts, dict | torch.nn.Module) or not isinstance(state_dicts, list | tuple):
        raise WsymInputError(
            f"wsym.merge needs a list of state dicts, got {type(state_dicts).__name__}; "
            "pass [model_a.state_dict(), model_b.state_dict(), ...]"
        )
    if len(state_dicts) < 2:
        raise WsymInputError("merge needs at least two state dicts")
    check_same_architecture(spec, *state_dicts)
    needs_data = (reset_batchnorm and "reset_batchnorm") or (repair and "repair")
    if needs_data and (model is None or batches is None):
        raise WsymInputError(f"{needs_data} needs model= and batches=")
    batches = list(batches) if batches is not None else None
    ref = state_dicts[reference]
    if refine == "auto" and len(state_dicts) > 2:
        refine = "none"

    def aligned_to(target, sd):
        return align(
            target,
            sd,
            spec,
            method,
            continuous=continuous,
            residual=residual,
            refine=refine,
            loss_fn=loss_fn,
            model=model,
            batches=batches,
            dtype=dtype,
        )

    aligned = [sd if i == reference else aligned_to(ref, sd) for i, sd in enumerate(state_dicts)]
    history = [_spread(spec, aligned)]
    done = 0
    order = random.Random(seed)
    while len(state_dicts) > 2 and done < rounds:
        done += 1
        trial = list(aligned)
        for i in order.sample(range(len(trial)), len(trial)):
            others = _mean([sd for j, sd in enumerate(trial) if j != i], ref)
            trial[i] = aligned_to(others, state_dicts[i])
        value = _spread(spec, trial)
        if value >= history[-1] * (1 - 1e-9):
            break
        aligned, history = trial, [*history, value]
    merged = _mean(aligned, ref)
    if repair:
        merged = repair_fn(model, merged, aligned, [1 / len(aligned)] * len(aligned), batches)
    elif reset_batchnorm:
        merged = reset_batchnorm_stats(model, merged, batches)
    if not with_report:
        return merged
    barriers = ()
    if loss_fn is not None and model is not None and batches is not None:
        barriers = tuple(interpolate(model, sd, merged, batches, loss_fn).barrier for sd in aligned)
    return merged, MergeReport(tuple(aligned), done, tuple(history), barriers)


def _mean(state_dicts: list[dict], like: dict) -> dict:
    """The entrywise mean of the floating entries (others copied from ``like``)."""
    out = {}
    for key, value in like.items():
        if value.is_floating_point():
            total = state_dicts[0][key].to(torch.float64, copy=True)
            for sd in state_dicts[1:]:
                total += sd[key]
            out[key] = total.div_(len(state_dicts)).to(value.dtype)
        else:
            out[key] = value.clone()
    return out


def _spread(spec: SymmetrySpec, aligned: list[dict]) -> float:
    """``sum_i ||aligned_i - mean||^2`` (the MergeMany objective)."""
    center = _mean(aligned, aligned[0])
    return sum(mismatch(spec, center, sd) for sd in aligned)
