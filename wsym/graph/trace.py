"""Trace a module into an ATen graph and describe it as a networkx DiGraph.

``torch.export`` (non-strict) is tried first; its graph is functionalized with
``run_decompositions({})`` so that in-place writes become data flow. Models that
export cannot capture fall back to ``torch.fx.symbolic_trace`` is *not* done: an
fx graph of module calls carries no shapes, so detection would have to guess;
wsym reports the export error instead (see :func:`trace`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from wsym.errors import WsymInputError


@dataclass(frozen=True)
class Traced:
    """A functional ATen graph of a module with its parameter bookkeeping.

    Attributes:
        graph: the ``torch.fx.Graph`` (nodes carry ``meta['val']`` fake tensors).
        parameters: placeholder name -> state-dict key, for parameters.
        buffers: placeholder name -> state-dict key, for buffers.
        inputs: placeholder names of the user inputs.
    """

    graph: torch.fx.Graph
    parameters: dict[str, str]
    buffers: dict[str, str]
    inputs: tuple[str, ...]


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
        except Exception as err:  # noqa: BLE001
            msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise WsymInputError(
                f"torch.export cannot trace this model ({type(err).__name__}: {msg}); "
                "remove data-dependent control flow from forward or pass simpler inputs"
            ) from err
    sig = ep.graph_signature
    return Traced(
        graph=ep.graph,
        parameters=dict(sig.inputs_to_parameters),
        buffers=dict(sig.inputs_to_buffers),
        inputs=tuple(sig.user_inputs),
    )
