"""Trace a module into an ATen graph and describe it as a networkx DiGraph.

``torch.export`` (non-strict) captures an ATen graph whose nodes carry shapes;
``run_decompositions({})`` functionalizes it so that in-place writes become data
flow. Where export fails (data-dependent control flow, say), the fallback records
the ATen calls of one forward pass (:mod:`wsym.graph.record`). Shapes must be
static for the example inputs.
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from wsym.errors import WsymInputError
from wsym.graph.record import record
from wsym.graph.trace_types import Traced


def split_inputs(example_inputs) -> tuple[tuple, dict]:
    """``Tensor | tuple | dict`` -> ``(args, kwargs)``."""
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, list | tuple):
        return tuple(example_inputs), {}
    raise WsymInputError(
        f"example inputs of type {type(example_inputs).__name__}; pass a Tensor, a tuple of "
        "positional inputs or a dict of keyword inputs"
    )


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """Temporarily put ``model`` in eval mode (restoring each submodule's flag)."""
    flags = {m: m.training for m in model.modules()}
    model.eval()
    try:
        yield model
    finally:
        for m, flag in flags.items():
            m.train(flag)


def _require_static_shapes(graph: torch.fx.Graph) -> None:
    for node in graph.nodes:
        vals = node.meta.get("val")
        for v in vals if isinstance(vals, list | tuple) else [vals]:
            if hasattr(v, "shape") and not all(isinstance(s, int) for s in v.shape):
                raise WsymInputError(
                    f"operation {node.target} has a data-dependent output shape; wsym needs static "
                    "shapes: replace boolean-mask indexing or nonzero() with a fixed-shape op "
                    "(torch.where)"
                )


def trace(model: torch.nn.Module, example_inputs) -> Traced:
    """Export ``model`` (in eval mode) on ``example_inputs``.

    Raises:
        WsymInputError: if the model cannot be run or exported on these inputs.
    """
    args, kwargs = split_inputs(example_inputs)
    with eval_mode(model):
        try:
            with torch.no_grad():
                model(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - reported to the user as one line
            msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise WsymInputError(
                f"the model fails on the example inputs ({type(err).__name__}: {msg}); "
                "pass inputs of the shape and dtype its forward expects"
            ) from err
        try:
            ep = torch.export.export(model, args, kwargs, strict=False)
            ep = ep.run_decompositions({})
        except Exception as export_error:  # noqa: BLE001
            try:
                traced = record(model, args, kwargs)
            except Exception:  # noqa: BLE001
                msg = str(export_error).strip().splitlines()[0] if str(export_error).strip() else ""
                raise WsymInputError(
                    f"neither torch.export nor torch.fx can trace this model "
                    f"({type(export_error).__name__}: {msg}); "
                    "remove data-dependent control flow from forward"
                ) from export_error
            warnings.warn(
                f"torch.export failed ({type(export_error).__name__}); traced with torch.fx "
                "(recorded ATen calls) instead: control flow is specialized to the example inputs",
                stacklevel=3,
            )
            _require_static_shapes(traced.graph)
            return traced
    _require_static_shapes(ep.graph)
    sig = ep.graph_signature
    return Traced(
        graph=ep.graph,
        parameters=dict(sig.inputs_to_parameters),
        buffers=dict(sig.inputs_to_buffers),
        inputs=tuple(sig.user_inputs),
    )
