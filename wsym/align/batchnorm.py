"""BatchNorm running statistics along merges and paths: batch statistics, and their reset.

A merged or interpolated checkpoint keeps its endpoints' running statistics, which
no longer describe its own activations: :func:`reset_batchnorm_stats` recomputes
them on data, and :func:`batchnorm_batch_statistics` evaluates with batch
statistics instead (as training does).
"""

from __future__ import annotations

import contextlib
import copy

import torch

from wsym.models.calling import model_inputs


def batchnorm_layers(model) -> list:
    """The model's BatchNorm layers."""
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


@contextlib.contextmanager
def batchnorm_batch_statistics(model):
    """Every BatchNorm of ``model`` in training mode (batch statistics) inside the block."""
    norms = batchnorm_layers(model)
    modes = [m.training for m in norms]
    try:
        for m in norms:
            m.train()
        yield
    finally:
        for m, mode in zip(norms, modes, strict=True):
            m.train(mode)


def reset_batchnorm_stats(model: torch.nn.Module, state_dict: dict, batches) -> dict:
    """``state_dict`` with every BatchNorm's running statistics recomputed on ``batches``.

    The statistics are computed in the state dict's floating dtype; every other
    entry is returned as it is.
    """
    dtype = next(v.dtype for v in state_dict.values() if v.is_floating_point())
    net = copy.deepcopy(model).to(dtype)
    net.load_state_dict(state_dict)
    norms = batchnorm_layers(net)
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
