"""Merging aligned checkpoints, and BatchNorm statistics reset on data (REPAIR-style)."""

from __future__ import annotations

import copy

import torch

from wsym.align import align, check_same_architecture
from wsym.graph.trace import model_inputs
from wsym.group.spec import SymmetrySpec


def merge(
    state_dicts: list[dict],
    spec: SymmetrySpec,
    *,
    method: str = "weights",
    model: torch.nn.Module | None = None,
    batches=None,
    reset_batchnorm: bool = False,
    reference: int = 0,
) -> dict:
    """Average of ``state_dicts`` after aligning each to ``state_dicts[reference]``.

    Args:
        state_dicts: two or more state dicts of the architecture ``spec`` describes.
        spec: the :class:`~wsym.spec.SymmetrySpec`.
        method: alignment method, ``"weights"`` or ``"activations"``.
        model: the module (for activation matching and BatchNorm reset).
        batches: iterable of ``(inputs, targets)`` (activation matching, BatchNorm reset).
        reset_batchnorm: recompute BatchNorm running statistics of the merged
            weights on ``batches`` (averaged statistics are stale after merging).
        reference: index of the reference checkpoint.

    Example:
        >>> import torch, wsym
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
        >>> spec = wsym.detect(net, torch.randn(2, 3))
        >>> sd = {k: v.double() for k, v in net.state_dict().items()}
        >>> merged = wsym.merge([sd, spec.act(spec.sample(seed=2), sd)], spec)
        >>> max(float((merged[k] - sd[k]).abs().max()) for k in sd) < 1e-9
        True
    """
    if len(state_dicts) < 2:
        raise ValueError("merge needs at least two state dicts")
    check_same_architecture(spec, *state_dicts)
    ref = state_dicts[reference]
    batches = list(batches) if batches is not None else None
    aligned = [
        sd if i == reference else align(ref, sd, spec, method, model=model, batches=batches)
        for i, sd in enumerate(state_dicts)
    ]
    merged = {}
    for key, value in ref.items():
        if value.is_floating_point():
            merged[key] = (
                torch.stack([sd[key].to(torch.float64) for sd in aligned]).mean(0).to(value.dtype)
            )
        else:
            merged[key] = value.clone()
    if reset_batchnorm:
        if model is None or batches is None:
            raise ValueError("reset_batchnorm needs model= and batches=")
        merged = reset_batchnorm_stats(model, merged, batches)
    return merged


def reset_batchnorm_stats(model: torch.nn.Module, state_dict: dict, batches) -> dict:
    """``state_dict`` with every BatchNorm's running statistics recomputed on ``batches``.

    The statistics are computed in the state dict's floating dtype; every other
    entry is returned as it is.
    """
    dtype = next(v.dtype for v in state_dict.values() if v.is_floating_point())
    net = copy.deepcopy(model).to(dtype)
    net.load_state_dict(state_dict)
    norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over all batches
    net.train()
    with torch.no_grad():
        for inputs, _ in batches:
            args, kwargs = model_inputs(net, inputs)
            args = tuple(
                a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args
            )
            net(*args, **kwargs)
    stats = {
        f"{name}.{stat}": getattr(m, stat).detach().clone()
        for name, m in net.named_modules()
        if m in norms
        for stat in ("running_mean", "running_var", "num_batches_tracked")
        if getattr(m, stat, None) is not None
    }
    return {**state_dict, **{k: v for k, v in stats.items() if k in state_dict}}
