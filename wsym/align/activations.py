"""Running a traced model at a given state dict and reading intermediate activations."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.utils.stateless import _reparametrize_module

from wsym.detect import detection_trace
from wsym.detect.tracing.record import recorded_values
from wsym.errors import WsymInputError
from wsym.models.calling import eval_mode, lacks_float64, model_inputs


class _Capture(torch.fx.Interpreter):
    def __init__(self, gm, wanted: set[str]):
        super().__init__(gm)
        self.wanted, self.seen = wanted, {}

    def run_node(self, n):
        out = super().run_node(n)
        if n.name in self.wanted:
            self.seen[n.name] = out
        return out


def site_activations(model: torch.nn.Module, state_dict: dict, batches, sites) -> dict:
    """``{(node, dim): (samples, units)}`` float64 activations over all ``batches``.

    The model is traced on the first batch (batches of other shapes are skipped);
    every other axis of a site counts as samples (batch, positions, and feature
    axes of canonicalized blocks). The model itself is not modified.
    """
    return sites_at_states(model, [state_dict], batches, sites)[0]


def sites_at_states(model: torch.nn.Module, state_dicts: list, batches, sites) -> list[dict]:
    """:func:`site_activations` at each of ``state_dicts``, the model traced once.

    Batches of one tensor with the same trailing shape run as one batch (a
    recorded forward pass costs per operation, not per sample). A model with
    kernels only for float32 and below (Hugging Face's mixture-of-experts
    ``grouped_mm``) runs in float32; its activations are returned in float64.
    """
    batches = _joined(list(batches))
    if not batches:
        raise WsymInputError(
            "no batches given for activation matching; pass a few (inputs, targets)"
        )
    traced = detection_trace(model, batches[0][0])  # the graph the sites name nodes of
    try:
        return [_activations(model, traced, sd, batches, sites) for sd in state_dicts]
    except RuntimeError as err:
        if not lacks_float64(err):
            raise
    return [_activations(model, traced, sd, batches, sites, torch.float32) for sd in state_dicts]


def _activations(model, traced, state_dict: dict, batches: list, sites, dtype=torch.float64):
    state = {k: v.detach().to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    wanted = {node for node, _ in sites}
    if traced.program is None:  # recorded: record again, keeping the sites' values
        context = _at_state_in_eval(model, state)

        def values(args, kwargs):
            seen = recorded_values(model, args, kwargs, wanted)
            if not wanted <= set(seen):
                raise WsymInputError(
                    f"activation matching: the model's {dtype} forward pass runs other "
                    "operations than the traced one; use method='weights'"
                )
            return seen
    else:
        module = traced.program.module()  # shares the model's tensors: swapped, never modified
        context = _reparametrize_module(module, state, strict=False)

        def values(args, kwargs):
            interp = _Capture(module, wanted)
            interp.run(*args, *kwargs.values())
            return interp.seen

    out: dict = {site: [] for site in sites}
    shape = _shapes(batches[0][0])
    with torch.no_grad(), context:
        for inputs, _ in batches:
            if _shapes(inputs) != shape:  # the graph is specialized to the first batch's shapes
                continue
            args, kwargs = model_inputs(model, inputs)
            args = tuple(
                a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args
            )
            seen = values(args, kwargs)
            for node, d in sites:
                x = seen[node]
                out[(node, d)].append(x.movedim(d, -1).reshape(-1, x.shape[d]).double())
    return {site: torch.cat(v) for site, v in out.items()}


def _joined(batches: list) -> list:
    """``batches`` as one ``(inputs, None)`` where every input is a tensor of one trailing shape."""
    inputs = [b[0] for b in batches]
    if len(inputs) < 2 or not all(torch.is_tensor(x) and x.dim() > 0 for x in inputs):
        return batches
    if len({tuple(x.shape[1:]) for x in inputs}) != 1:
        return batches
    return [(torch.cat(inputs), None)]


@contextlib.contextmanager
def _at_state_in_eval(model: torch.nn.Module, state: dict):
    with _reparametrize_module(model, state, strict=False), eval_mode(model):
        yield


def _shapes(inputs) -> list[tuple[int, ...]]:
    if isinstance(inputs, dict):
        leaves = list(inputs.values())
    elif isinstance(inputs, tuple | list):
        leaves = list(inputs)
    else:
        leaves = [inputs]
    return [tuple(x.shape) for x in leaves if torch.is_tensor(x)]
