"""The traced graph with its parameter bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Traced:
    """A functional ATen graph of a module with its parameter bookkeeping.

    Attributes:
        graph: the ``torch.fx.Graph`` (nodes carry ``meta['val']``: fake or meta tensors).
        parameters: placeholder name -> state-dict key, for parameters.
        buffers: placeholder name -> state-dict key, for buffers.
        inputs: placeholder names of the user inputs.
        program: the ``torch.export.ExportedProgram`` (None for a recorded trace).
        value_reads: nodes where the forward pass read a tensor computed from its
            inputs or weights into Python (data-dependent control flow; recorded
            traces only).
        guards: ``(position, outcome)`` of the boolean value reads (``if t:``) whose
            tensor is computed from float inputs, weights or float buffers: the
            branches the trace took (positions count every boolean value read in
            call order; :mod:`wsym.detect.guards` explores the other outcomes).
        numbers: nodes whose value, computed from float inputs, weights or float
            buffers, the forward pass read into Python as a number (``x.item()``,
            ``float(x)``, ``x.tolist()``): a branch on it cannot be forced, so
            detection refuses every group of such a trace.
    """

    graph: torch.fx.Graph
    parameters: dict[str, str]
    buffers: dict[str, str]
    inputs: tuple[str, ...]
    program: object = field(default=None, compare=False, repr=False)
    value_reads: tuple[str, ...] = ()
    guards: tuple[tuple[int, bool], ...] = ()
    numbers: tuple[str, ...] = ()
