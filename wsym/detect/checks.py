"""What :func:`wsym.detect` needs of its inputs, checked at the entry in one line each."""

from __future__ import annotations

import torch

from wsym.detect.tracing.traced import Traced
from wsym.errors import WsymInputError, check_finite
from wsym.models.arguments import check_module


def check_model(model, example_inputs) -> None:
    """Raise a one-line :class:`~wsym.errors.WsymInputError` for what detection cannot read.

    A non-module (a number, a function, a state dict), a module without
    parameters, non-finite weights, or no example inputs.

    Example:
        >>> check_model({"w": torch.ones(2)}, torch.ones(1))
        Traceback (most recent call last):
        ...
        wsym.errors.WsymInputError: wsym.detect needs a torch.nn.Module, got dict ...
    """
    check_module(model, "wsym.detect", finite=False)
    if next(iter(model.parameters()), None) is None:
        raise WsymInputError(
            f"{type(model).__name__} has no parameters, so no parameter-space symmetries; "
            "pass a module with weights"
        )
    if example_inputs is None:
        raise WsymInputError(
            "wsym.detect needs example inputs; pass a batch the model runs on "
            "(a Tensor, a tuple of positional inputs or a dict of keyword inputs)"
        )
    check_finite(model.state_dict())


def check_outputs(traced: Traced) -> None:
    """Raise a one-line error where the forward pass returns no floating-point tensor."""
    out = next(n for n in reversed(traced.graph.nodes) if n.op == "output")
    vals = [s.meta.get("val") for s in out.all_input_nodes]
    if not any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vals):
        raise WsymInputError(
            "the model's forward returns no floating-point tensor, so there is no output to keep "
            "unchanged; return the output tensor (or a tuple/dict holding it)"
        )


__all__ = ["check_model", "check_outputs"]
