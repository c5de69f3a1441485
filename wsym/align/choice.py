"""The default alignment: cheap candidates, the one with the lowest measured objective kept.

Weight matching is coordinate descent on a non-convex objective, and no single
start wins everywhere: the settled start wins on the MLP pairs, the canonical
start recovers a rescaled copy and wins on BatchNorm CNNs, activation matching
wins where data is given. :func:`choose` runs every cheap candidate and keeps
the one with the lowest objective it can measure:

* without data, the weight-matching objective ``D = sum_k ||g . other_k - ref_k||^2``
  (:func:`wsym.align.continuous.mismatch`);
* with ``model`` and ``batches`` of ``(inputs, targets)``, the loss along the path,
  ``mean_t loss((1 - t) ref + t g . other)`` over :data:`PATH_POINTS` on the batches
  joined into one, every BatchNorm in training mode (its statistics those of the
  point's own batch: the statistics reset along the path); every candidate's end
  computes ``other``'s function, so the endpoint losses are the same for all and the
  mean ranks the barriers.

A candidate on the reference itself (``D <= 1e-16 ||ref||^2``: a recovered copy)
wins outright, so a moved copy of the reference is always returned to it. Candidates
named in ``recovery_only`` win only so: ``wsym.align`` passes its canonical start there
when it has no path loss (its lower ``D`` gave higher barriers on the MLP pairs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch.func import functional_call

from wsym.align.batchnorm import batchnorm_batch_statistics
from wsym.align.continuous import mismatch
from wsym.errors import WsymInputError
from wsym.group.spec import SymmetrySpec
from wsym.models.calling import eval_mode, joined_pairs, model_inputs

# The interior points the path objective is estimated on.
PATH_POINTS = (0.25, 0.5, 0.75)
# A candidate this close to the reference (D relative to ||ref||^2) is the reference.
RECOVERED = 1e-16


@dataclass(frozen=True)
class AlignReport:
    """What the default alignment chose (``wsym.align(..., with_report=True)``).

    Attributes:
        chosen: the winning candidate's name.
        objective: ``"weights"`` (weight-matching objective) or ``"path"`` (loss along the path).
        values: ``{candidate: objective}`` of every candidate run.
        recovered: the chosen candidate is on the reference (a moved copy undone).
    """

    chosen: str
    objective: str
    values: dict
    recovered: bool = False


def has_targets(model, batches) -> bool:
    """Whether the path loss can be taken: a model and batches with targets."""
    return (
        model is not None
        and bool(batches)
        and all(isinstance(b, (tuple, list)) and len(b) == 2 and b[1] is not None for b in batches)
    )


def choose(
    spec: SymmetrySpec,
    ref: dict,
    candidates,
    *,
    model=None,
    batches=None,
    loss_fn=None,
    recovery_only=frozenset(),
):
    """``(moved, AlignReport)``: the candidate with the lowest objective.

    Args:
        spec: the :class:`~wsym.group.spec.SymmetrySpec`.
        ref: the reference state dict.
        candidates: ``[(name, thunk)]``, each thunk returning the other state dict
            aligned to ``ref`` (same function as the other), run in turn; one that
            raises :class:`~wsym.errors.WsymInputError` is passed over (raised if none
            applies).
        model: the module, with ``batches`` for the path objective.
        batches: ``(inputs, targets)`` pairs (the path objective where targets are given).
        loss_fn: ``loss_fn(outputs, targets)``, cross-entropy by default.
        recovery_only: candidates that win only by landing on ``ref`` (their objective
            is reported, not compared).

    Example:
        >>> import torch, wsym
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        >>> spec = wsym.detect(net, torch.randn(2, 3))
        >>> sd = {k: v.double() for k, v in net.state_dict().items()}
        >>> far = {k: v + 1 for k, v in sd.items()}
        >>> moved, rep = choose(spec, sd, [("far", lambda: far), ("same", lambda: sd)])
        >>> rep.chosen, rep.objective
        ('same', 'weights')
    """
    scale = mismatch(spec, _Float64(ref), _Float64(ref, zeros=True))
    on_path = has_targets(model, batches)
    values, best, best_name, refusal = {}, None, None, None
    for name, thunk in candidates:
        try:
            moved = thunk()
        except WsymInputError as err:  # a candidate that does not apply: passed over
            refusal = err
            continue
        distance = weight_distance(spec, ref, moved)
        if distance <= RECOVERED * scale:
            values[name] = 0.0
            return moved, AlignReport(name, "path" if on_path else "weights", values, True)
        if on_path:
            value = path_objective(model, ref, moved, batches, loss_fn)
        else:
            value = distance
        values[name] = value
        if name in recovery_only:
            continue
        if best is None or value < values[best_name]:
            best, best_name = moved, name
    if not values and refusal is not None:  # no candidate applied: its reason, not None
        raise refusal
    return best, AlignReport(best_name, "path" if on_path else "weights", values)


def path_objective(model, ref: dict, moved: dict, batches, loss_fn=None) -> float:
    """``mean_t loss((1 - t) ref + t moved)`` over :data:`PATH_POINTS`, statistics reset.

    The batches are joined into one where they share a shape; BatchNorm layers run
    in training mode on copies of their buffers (each point's statistics are its
    batch's), every other module in eval mode. Holds one interpolated state dict
    at the model's dtype.
    """
    loss_fn = loss_fn if loss_fn is not None else torch.nn.functional.cross_entropy
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    joined = joined_pairs(list(batches))
    total = 0.0
    with torch.no_grad(), eval_mode(model), batchnorm_batch_statistics(model):
        for t in PATH_POINTS:
            state = {
                k: ((1 - t) * v.double() + t * moved[k].double()).to(dtype)
                if v.is_floating_point()
                else v.clone()
                for k, v in ref.items()
            }
            for inputs, targets in joined:
                args, kwargs = model_inputs(model, inputs)
                args = tuple(
                    a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args
                )
                outputs = functional_call(model, state, args, kwargs)
                total += float(loss_fn(outputs, targets)) / (len(PATH_POINTS) * len(joined))
    return total


def weight_distance(spec: SymmetrySpec, ref: dict, other: dict) -> float:
    """The weight-matching objective ``sum ||other_k - ref_k||^2``, float64 a tensor at a time."""
    return mismatch(spec, _Float64(ref), _Float64(other))


class _Float64(Mapping):
    """``sd`` read at float64 one tensor at a time (zeros of its shapes with ``zeros``).

    The objective's sums are those of float64 copies, without holding two of them.
    """

    def __init__(self, sd: Mapping, zeros: bool = False):
        self._sd, self._zeros = sd, zeros

    def __getitem__(self, key):
        v = self._sd[key]
        if not v.is_floating_point():
            return v
        return torch.zeros(v.shape, dtype=torch.float64) if self._zeros else v.detach().double()

    def __iter__(self):
        return iter(self._sd)

    def __len__(self):
        return len(self._sd)
